//! The held-back group queue that `coarse_write_secs` (each level) and `quantile_write_secs`
//! share: the open group's first window, and the chunks of ended groups dealt over the next
//! period's windows, so that a group's end does not make one window several times as costly as
//! the others.

use std::collections::VecDeque;

use crate::store::FlushChunk;

#[derive(Debug, Default)]
pub(super) struct Held {
    /// The open group's first window.
    pub(super) group: Option<u64>,
    /// Chunks of ended groups not yet given to a window.
    pub(super) queued: VecDeque<FlushChunk>,
    /// How many of them a window takes.
    pub(super) per_window: usize,
}

impl Held {
    /// Queues an ended group's chunks, dealt over the next `windows` windows.
    pub(super) fn queue(&mut self, chunks: Vec<FlushChunk>, windows: usize) {
        self.queued.extend(deal(chunks, windows));
        self.per_window = self.queued.len().div_ceil(windows);
    }

    /// A window's share of the queued chunks: all of them when `last`.
    pub(super) fn share(&mut self, last: bool) -> impl Iterator<Item = FlushChunk> + '_ {
        let take = if last {
            self.queued.len()
        } else {
            self.per_window.min(self.queued.len())
        };
        self.queued.drain(..take)
    }
}

/// Orders a group's chunks for `windows` windows that take them in turn, as many each: chunk
/// `j` goes to the `j % windows`th. A group's chunks of one kind come together (its timers'
/// stats after its counters) and cost Redis more or less than the others; taken in blocks,
/// they made one window of every period the slowest.
pub(super) fn deal<T>(chunks: Vec<T>, windows: usize) -> impl Iterator<Item = T> {
    let mut hands: Vec<Vec<T>> = (0..windows).map(|_| Vec::new()).collect();
    for (j, chunk) in chunks.into_iter().enumerate() {
        hands[j % windows].push(chunk);
    }
    hands.into_iter().flatten()
}
