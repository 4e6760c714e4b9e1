//! Every integration test of the `weft` command in one binary: each file beside this one is a module (`cli`,
//! `fuse`, `nfs4`, ...), and `common` is the cluster they all start. One binary, not one per file: each file linked
//! on its own was ~40 CPU seconds of compiling and linking the same dependencies again (43 files, 16 of CI's 50
//! minutes); one binary compiles them once. Run one file's tests with a filter: `cargo test --test integration
//! fuse::` (tests run 2 at a time across files, as they ran 2 at a time within each file before).

mod common;
mod fsx;

mod auth;
mod cache_attrs;
mod cache_bank;
mod cache_data;
mod cache_perf;
mod capabilities;
mod cli;
mod concurrency;
mod crash;
mod data_path;
mod db_failover;
mod ds_faults;
mod ec;
mod ec_delta;
mod ec_hole;
mod ec_streams;
mod exactly_once;
mod exercisers;
mod fabric;
mod failover;
mod fencing;
mod fuse;
mod heal;
mod hostile;
mod hostile_peers;
mod leases;
mod locks;
mod membership;
mod meta_backup;
mod meta_services;
mod metrics;
mod model;
mod namespace;
mod nfs3;
mod nfs4;
mod permissions;
mod pnfs_ds;
mod rpc;
mod scrub;
mod tls;
mod xattrs;
