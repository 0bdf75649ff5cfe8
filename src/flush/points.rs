//! Carbon points (`carbon_tcp`, `carbon_udp`): placed when their window closes, each into the
//! slice of the finest precision whose retention keeps its age, then written by the window's
//! chunks (`flush.lua`'s points section), so exactly once as everything else.

use super::Closer;
use crate::aggregate::Window;
use crate::aggregate::points::{self, SeriesPoints};

impl Closer {
    /// Takes `window`'s carbon points and places them at `start` (the window's time is
    /// whisper's `now`); counts what became of them.
    pub(super) fn place_points(&self, start: u64, window: &mut Window) -> Vec<SeriesPoints> {
        let counts = &self.telemetry.carbon_points;
        counts[3].increment(std::mem::take(&mut window.points_nan));
        counts[4].increment(std::mem::take(&mut window.points_capped));
        counts[5].increment(std::mem::take(&mut window.points_blacklisted));
        counts[6].increment(std::mem::take(&mut window.points_not_whitelisted));
        if window.points.is_empty() {
            return Vec::new();
        }
        let mut taken: Vec<_> = std::mem::take(&mut window.points).into_iter().collect();
        taken.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let schemas = &self.chunker.settings.schemas;
        let (placed, outcomes) = points::place(taken, schemas, start, &self.aggregations);
        counts[0].increment(outcomes.placed);
        counts[1].increment(outcomes.too_old);
        counts[2].increment(outcomes.too_far_ahead);
        placed
    }
}
