//! Honest capacity: which data servers store on the same file system, the cluster's space counted once per file
//! system, and the space usable under each redundancy policy.
//!
//! A data server reports its space with the identity of the file system under its root ([`DeviceId`], op 217
//! `SpaceStatDev`, and the MDS heartbeat 126 `RegisterServerDev`). Two servers share a file system when they run
//! on the same host (equal boot ids) and either their roots have the same `st_dev` (one mounted file system, also
//! through bind mounts) or the same non-zero statvfs `f_fsid` (the same file system seen through an overlay, whose
//! `st_dev` differs). `st_dev` alone is not enough: device numbers repeat across hosts (every host has an `8:1`);
//! `f_fsid` alone is not either: it is 0 on some file systems and repeats on cloned disk images. Not recognised:
//! one network file system mounted on several hosts, and btrfs subvolumes (each has its own `st_dev` and `f_fsid`);
//! those are still counted once per server.

use serde::{Deserialize, Serialize};

use crate::types::SpaceStat;

/// Longest `DeviceId::host_id` accepted (a boot id is 36 bytes).
pub const HOST_ID_BYTES_MAX: usize = 64;

/// The identity of the file system a data server's root lives on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeviceId {
    /// The host's boot id (`/proc/sys/kernel/random/boot_id`); empty when unknown, which matches nothing.
    pub host_id: String,
    /// `st_dev` of the root directory.
    pub dev: u64,
    /// statvfs `f_fsid` of the root directory (0: the file system has none).
    pub fsid: u64,
}

/// Op 217's reply: a data server's space and the file system it is on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpaceStatDev {
    pub space: SpaceStat,
    pub device: DeviceId,
}

impl DeviceId {
    /// Same file system (see the module doc).
    pub fn same_device(&self, other: &DeviceId) -> bool {
        !self.host_id.is_empty()
            && self.host_id == other.host_id
            && (self.dev == other.dev || (self.fsid != 0 && self.fsid == other.fsid))
    }
}

/// One file system and the servers on it, its space counted once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpace {
    /// The servers storing on it, ascending.
    pub servers: Vec<u32>,
    pub bytes_total: u64,
    pub bytes_free: u64,
}

/// Groups servers `(id, space, device)` by file system. A server whose device is unknown (an older data server, or
/// one not heard from) is its own group. Within a group the reports were taken at different moments: the largest
/// total and the smallest free are kept, so the cluster never claims more than one report showed. Groups are
/// ordered by their smallest server id.
pub fn count_once(servers: &[(u32, SpaceStat, Option<DeviceId>)]) -> Vec<DeviceSpace> {
    // Union-find over the pairs that match: `same_device` need not be transitive (dev equal for a–b, fsid equal
    // for b–c), and servers chained that way all share one file system.
    let n = servers.len();
    let mut parent: Vec<usize> = (0..n).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    for i in 0..n {
        for j in i + 1..n {
            if let (Some(a), Some(b)) = (&servers[i].2, &servers[j].2)
                && a.same_device(b)
            {
                let (ri, rj) = (root(&mut parent, i), root(&mut parent, j));
                parent[ri.max(rj)] = ri.min(rj);
            }
        }
    }
    let mut groups: std::collections::BTreeMap<usize, DeviceSpace> = std::collections::BTreeMap::new();
    for (i, (id, space, _)) in servers.iter().enumerate() {
        let r = root(&mut parent, i);
        let g = groups.entry(r).or_insert(DeviceSpace { servers: Vec::new(), bytes_total: 0, bytes_free: u64::MAX });
        g.servers.push(*id);
        g.bytes_total = g.bytes_total.max(space.bytes_total);
        g.bytes_free = g.bytes_free.min(space.bytes_free);
    }
    let mut out: Vec<DeviceSpace> = groups.into_values().collect();
    for g in &mut out {
        g.servers.sort_unstable();
    }
    out.sort_by_key(|g| g.servers[0]);
    out
}

/// How a file's bytes are stored. Erasure coding is not merged yet: it becomes a variant here, and its arm in
/// [`usable_bytes`] the arithmetic of k data + m parity pieces on distinct devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Redundancy {
    /// Plain striping (today's only policy): every byte stored once.
    Striping,
}

impl Redundancy {
    /// Every policy a cluster of this version can use, for `weft status`.
    pub const ALL: &'static [Redundancy] = &[Redundancy::Striping];

    pub fn name(self) -> &'static str {
        match self {
            Redundancy::Striping => "striping",
        }
    }
}

/// Bytes of file data that still fit under `policy`, given the free space of each file system (counted once).
pub fn usable_bytes(policy: Redundancy, per_device_free: &[u64]) -> u64 {
    match policy {
        Redundancy::Striping => per_device_free.iter().fold(0u64, |a, b| a.saturating_add(*b)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(host: &str, dev: u64, fsid: u64) -> Option<DeviceId> {
        Some(DeviceId { host_id: host.into(), dev, fsid })
    }

    fn sp(total: u64, free: u64) -> SpaceStat {
        SpaceStat { bytes_total: total, bytes_free: free, objects: 0 }
    }

    #[test]
    fn four_servers_on_one_disk_count_once() {
        let s: Vec<_> = (1..=4).map(|id| (id, sp(1000, 400 + id as u64), dev("h", 7, 9))).collect();
        let g = count_once(&s);
        assert_eq!(g, vec![DeviceSpace { servers: vec![1, 2, 3, 4], bytes_total: 1000, bytes_free: 401 }]);
    }

    #[test]
    fn same_dev_on_other_hosts_is_another_disk() {
        let s = vec![(1, sp(1000, 500), dev("a", 2049, 0)), (2, sp(2000, 700), dev("b", 2049, 0))];
        let g = count_once(&s);
        assert_eq!(g.len(), 2);
        assert_eq!((g[0].bytes_total, g[1].bytes_total), (1000, 2000));
    }

    #[test]
    fn fsid_joins_an_overlay_and_zero_fsid_joins_nothing() {
        // 1 and 2: same fsid, different st_dev (overlay). 3: its own disk with fsid 0, as is 4; 0 never matches.
        let s = vec![
            (1, sp(100, 50), dev("h", 1, 77)),
            (2, sp(100, 40), dev("h", 2, 77)),
            (3, sp(300, 30), dev("h", 3, 0)),
            (4, sp(400, 20), dev("h", 4, 0)),
        ];
        let g = count_once(&s);
        assert_eq!(g.iter().map(|g| g.servers.clone()).collect::<Vec<_>>(), vec![vec![1, 2], vec![3], vec![4]]);
        assert_eq!((g[0].bytes_total, g[0].bytes_free), (100, 40));
    }

    #[test]
    fn chains_join_and_unknown_devices_stand_alone() {
        // 3–1 by dev, 1–2 by fsid: one group; listed out of order. 5 unknown, empty host ids never match.
        let s = vec![
            (3, sp(10, 5), dev("h", 1, 0)),
            (5, sp(10, 5), None),
            (1, sp(10, 4), dev("h", 1, 8)),
            (2, sp(10, 3), dev("h", 2, 8)),
            (6, sp(10, 5), dev("", 1, 8)),
            (7, sp(10, 5), dev("", 1, 8)),
        ];
        let g = count_once(&s);
        let ids: Vec<_> = g.iter().map(|g| g.servers.clone()).collect();
        assert_eq!(ids, vec![vec![1, 2, 3], vec![5], vec![6], vec![7]]);
        assert_eq!(g[0].bytes_free, 3);
        assert!(count_once(&[]).is_empty());
    }

    #[test]
    fn striping_can_use_all_free_space() {
        assert_eq!(usable_bytes(Redundancy::Striping, &[]), 0);
        assert_eq!(usable_bytes(Redundancy::Striping, &[10, 20, 30]), 60);
        assert_eq!(usable_bytes(Redundancy::Striping, &[u64::MAX, 1]), u64::MAX, "saturates");
    }
}
