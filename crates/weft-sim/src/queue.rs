//! The event queue: what happens next, in (time, order of scheduling). Ties break by the order events were
//! scheduled, never by a hash or an address, so a seed replays exactly.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Events of type `E` at simulated times (µs).
#[derive(Debug)]
pub struct Queue<E> {
    now_us: u64,
    seq: u64,
    heap: BinaryHeap<Reverse<(u64, u64, Slot<E>)>>,
    /// Bound on pending events: a simulation that schedules without end is a bug in the simulation.
    pending_max: usize,
}

/// An event, ordered only by its place (the heap never compares events themselves).
#[derive(Debug)]
struct Slot<E>(E);

impl<E> PartialEq for Slot<E> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl<E> Eq for Slot<E> {}
impl<E> PartialOrd for Slot<E> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Slot<E> {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

impl<E> Queue<E> {
    pub fn new(pending_max: usize) -> Queue<E> {
        Queue { now_us: 0, seq: 0, heap: BinaryHeap::new(), pending_max }
    }

    /// The time of the event last taken (µs).
    pub fn now_us(&self) -> u64 {
        self.now_us
    }

    /// Schedules `event` `delay_us` from now.
    pub fn after(&mut self, delay_us: u64, event: E) {
        assert!(self.heap.len() < self.pending_max, "more than {} events pending", self.pending_max);
        self.seq += 1;
        self.heap.push(Reverse((self.now_us.saturating_add(delay_us), self.seq, Slot(event))));
    }

    /// The next event, moving time to it; `None` when nothing is left before `until_us`.
    pub fn next_before(&mut self, until_us: u64) -> Option<E> {
        let Reverse((at, _, _)) = self.heap.peek()?;
        if *at >= until_us {
            return None;
        }
        let Reverse((at, _, Slot(event))) = self.heap.pop()?;
        assert!(at >= self.now_us, "time went backwards");
        self.now_us = at;
        Some(event)
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_in_time_order_and_ties_in_scheduling_order() {
        let mut q = Queue::new(16);
        q.after(20, "c");
        q.after(10, "a");
        q.after(10, "b");
        assert_eq!(q.next_before(100), Some("a"));
        assert_eq!(q.now_us(), 10);
        q.after(0, "b2");
        assert_eq!(q.next_before(100), Some("b"));
        assert_eq!(q.next_before(100), Some("b2"));
        assert_eq!(q.next_before(15), None, "c is at 20");
        assert_eq!(q.next_before(100), Some("c"));
        assert!(q.is_empty());
    }
}
