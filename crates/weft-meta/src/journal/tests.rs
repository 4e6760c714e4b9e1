//! Tests of the journal framing and recovery scan.
