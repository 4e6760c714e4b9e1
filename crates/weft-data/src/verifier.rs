//! The write verifier (docs/format.md §33): a number that stays the same while this server's unsynced writes
//! survive and changes when they may have been lost, so a client's fsync can tell "synced" from "synced what was
//! left after a crash".
//!
//! Why the boot id and not a number drawn at each start: a `kill -9` of the process loses nothing (the page cache
//! belongs to the kernel), and a verifier that changed then would fail every plain file's fsync after a restart
//! for no loss; only a reboot (power loss, a kernel crash) drops unsynced writes.

use std::sync::OnceLock;

/// This server's write verifier: FNV-1a 64 of the host's boot id (a test build's `WEFT_FAULT=boot-id:TEXT`: of
/// `TEXT`), or a random number when the boot id cannot be read. Never 0.
pub fn write_verifier() -> u64 {
    static VERIFIER: OnceLock<u64> = OnceLock::new();
    *VERIFIER.get_or_init(|| {
        let boot_id = weft_rpc::fault::boot_id().unwrap_or_else(weft_fabric::host_id);
        let v = if boot_id.is_empty() { weft_rpc::auth::random_id() } else { of_boot_id(&boot_id) };
        tracing::info!(verifier = format_args!("{v:#018x}"), "write verifier (changes with the host's boot id)");
        v
    })
}

/// The verifier of a boot id: FNV-1a 64 of its bytes, 1 in place of 0.
pub fn of_boot_id(boot_id: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let h = boot_id.bytes().fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME));
    h.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_boot_id_names_one_verifier_and_another_boot_another() {
        let a = of_boot_id("0b5b2a8e-3c1d-4f6e-9a7b-1c2d3e4f5a6b");
        assert_eq!(a, of_boot_id("0b5b2a8e-3c1d-4f6e-9a7b-1c2d3e4f5a6b"));
        assert_ne!(a, of_boot_id("0b5b2a8e-3c1d-4f6e-9a7b-1c2d3e4f5a6c"));
        assert_ne!(of_boot_id(""), 0);
        assert_ne!(write_verifier(), 0);
        assert_eq!(write_verifier(), write_verifier());
    }
}
