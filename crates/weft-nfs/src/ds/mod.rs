//! The pNFS data server (docs/format.md §23): every Weft data server can also answer NFSv4.1 for the objects it
//! stores, so a pNFS client given a file layout by the gateway (the metadata server) reads and writes the data
//! servers directly and in parallel.
//!
//! - [`fh`]: the data-server filehandle, a §10 capability sealed by the MDS for key id `"pnfs"` plus the stripe
//!   geometry that maps the client's file offsets to this server's object offsets.

pub mod fh;
