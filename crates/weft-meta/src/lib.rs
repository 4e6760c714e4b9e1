//! weft-meta
