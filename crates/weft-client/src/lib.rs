//! weft-client
