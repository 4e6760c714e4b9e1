//! weft-rpc
