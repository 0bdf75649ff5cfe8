//! At start, with a spool: the windows an earlier run left are queued ahead of this run's, and
//! the coarse sums are taken up where it left them.

use std::sync::Arc;

use std::path::PathBuf;

use super::backlog::{Backlog, PendingWindow, Spooled};
use super::{Closer, state};
use crate::spool::Spool;
use crate::store::FlushChunk;

impl Closer {
    /// Queues the windows earlier runs left in the spool, ahead of this run's, and takes up
    /// the coarse sums where the last run left them.
    pub(super) fn replay(&mut self, spool: &Spool, backlog: &Backlog) {
        let last_closed = spool.load_state().and_then(|state| {
            let restored = state::restore(&state, self.coarse.as_mut(), self.quantiles.as_mut());
            if restored.is_none() {
                tracing::error!(
                    "spool state file is not one this version wrote; the sums it held are lost"
                );
            }
            restored
        });
        // Where the window taken from the state file went: its file, or memory only.
        let mut from_state = None;
        let mut windows = match spool.load() {
            Ok(windows) => windows,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the spool; its windows are not written");
                Vec::new()
            }
        };
        // The last window closed before the crash, if its own file was never written. (If it
        // was written to Redis and removed, Redis answers that its chunks were applied.) It gets
        // a file now: this run's first close replaces the state file that held it.
        // It was its run's last window to close, so it goes after that run's files.
        if let Some((start, sequence, chunks)) = last_closed.filter(|(start, sequence, chunks)| {
            !chunks.is_empty()
                && !windows.iter().any(|f| {
                    f.start == *start
                        && f.sequence == *sequence
                        && f.chunks.first().map(|c| (c.seq, c.parts()))
                            == chunks.first().map(|c| (c.seq, c.parts()))
                })
        }) {
            let chunks: Vec<Arc<FlushChunk>> = chunks.into_iter().map(Arc::new).collect();
            let number = 1 + windows
                .iter()
                .filter(|w| w.sequence == sequence)
                .map(|w| w.number)
                .max()
                .unwrap_or(0);
            let written = spool.write(start, number, &sequence, &chunks);
            if let Err(e) = &written {
                self.window_not_spooled(start, e);
            }
            from_state = Some(Spooled::from_write(written, number, &chunks));
            windows.push(crate::spool::SpooledWindow {
                start,
                number,
                sequence,
                chunks,
                path: PathBuf::new(),
            });
        }
        if !windows.is_empty() {
            tracing::info!(
                windows = windows.len(),
                "writing the windows an earlier run left in the spool"
            );
        }
        for w in windows {
            if !self.chunker.takes_sequence(&w.sequence) {
                tracing::error!(
                    window = w.start,
                    path = %w.path.display(),
                    "this spool file was written for another redis_mode; it is kept aside (*.bad), not replayed"
                );
                let _ = std::fs::rename(&w.path, w.path.with_extension("bad"));
                continue;
            }
            self.telemetry.spool_windows_loaded.increment(1);
            let pending = PendingWindow {
                id: 0,
                start: w.start,
                sequence: w.sequence.into(),
                // The run that spooled them may have sent them.
                sent: vec![true; w.chunks.len()],
                chunks: w.chunks,
                // Only the window taken from the state file has no path here.
                spooled: match from_state.take_if(|_| w.path.as_os_str().is_empty()) {
                    Some(spooled) => spooled,
                    None => Spooled::File(w.path),
                },
            };
            backlog.push(pending, &self.config, Some(spool), &self.telemetry);
        }
    }
}
