//! A bounded cache of file layouts by inode. Layouts never change after create, so entries never go stale; the
//! bound only limits memory (when full, the oldest half is dropped).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use weft_proto::Layout;

pub struct LayoutCache {
    entries_max: usize,
    inner: Mutex<(HashMap<u64, Layout>, VecDeque<u64>)>,
}

impl LayoutCache {
    pub fn new(entries_max: usize) -> LayoutCache {
        LayoutCache { entries_max: entries_max.max(1), inner: Mutex::new((HashMap::new(), VecDeque::new())) }
    }

    pub fn insert(&self, ino: u64, layout: Layout) {
        let mut g = self.inner.lock().expect("layout cache");
        let (map, order) = &mut *g;
        if map.insert(ino, layout).is_none() {
            order.push_back(ino);
        }
        if map.len() > self.entries_max {
            for _ in 0..self.entries_max.div_ceil(2) {
                if let Some(old) = order.pop_front() {
                    map.remove(&old);
                }
            }
        }
    }

    pub fn get(&self, ino: u64) -> Option<Layout> {
        self.inner.lock().expect("layout cache").0.get(&ino).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded() {
        let c = LayoutCache::new(4);
        let l = Layout {
            stripe_unit: 4096,
            stripe_count: 1,
            servers: vec![0],
            redundancy: weft_proto::DataRedundancy::Plain,
            generation: 0,
        };
        for i in 0..100 {
            c.insert(i, l.clone());
        }
        assert!(c.inner.lock().unwrap().0.len() <= 4);
        assert!(c.get(99).is_some());
        assert!(c.get(0).is_none());
    }
}
