//! weft-data
