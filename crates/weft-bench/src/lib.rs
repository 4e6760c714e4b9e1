//! weft-bench
