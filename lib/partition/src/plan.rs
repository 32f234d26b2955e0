//! The one check of a `plan/1` table against the trace it is applied to, used by every
//! consumer (gradselect `--plan`, gradallreduce `--plan` for deft and oktopk, the DEFT and
//! Ok-Topk exchanges), so a plan one tool rejects is rejected by all, with the same message.
//!
//! A plan is valid for a trace of P ranks, layers `layout` and first step s₀ when: its method
//! (metadata `gradkit.method`, and the `k` column: set for DEFT, null for Ok-Topk) is the one
//! asked for; it was made for P workers (metadata `gradkit.world_size` when present, and every
//! plan step's largest `worker` is P − 1); its first step is ≤ s₀ (every step of the trace has
//! a plan in force); every row names a layer of the trace by id and name with
//! `start ≤ end ≤ numel`; and the non-empty ranges of each plan step tile the model's flat
//! index space exactly once (no gap, no overlap) — for Ok-Topk, in worker order.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use anyhow::{bail, ensure, Result};
use gradkit_core::io::Meta;
use gradkit_core::trace::Layout;
use gradkit_core::PlanRow;

/// Which exchange a plan is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanKind {
    /// DEFT ranges: every row carries its `k`.
    Deft,
    /// Ok-Topk reduce regions: `k` is null; regions are contiguous in worker order.
    Oktopk,
}

impl PlanKind {
    pub fn name(self) -> &'static str {
        match self {
            PlanKind::Deft => "deft",
            PlanKind::Oktopk => "oktopk",
        }
    }
}

/// A checked plan: its steps in ascending order, each with its rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub steps: Vec<(u32, Vec<PlanRow>)>,
}

impl Plan {
    /// The rows in force at `step`: the latest plan step ≤ `step` (the check guarantees one
    /// exists for every step of the trace; earlier steps get the first plan step).
    pub fn at(&self, step: u32) -> &[PlanRow] {
        let i = self.steps.partition_point(|(s, _)| *s <= step);
        &self.steps[i.saturating_sub(1)].1
    }
}

/// Checks `rows` (with the file's metadata `meta`, when read from a file) as a `kind` plan for
/// a trace of `world` ranks, layers `layout` and first step `first_step`.
pub fn check(
    rows: Vec<PlanRow>,
    meta: Option<&Meta>,
    kind: PlanKind,
    layout: &Layout,
    world: usize,
    first_step: u32,
) -> Result<Plan> {
    if let Some(m) = meta.and_then(|m| m.get("method")) {
        if m != kind.name() {
            bail!(
                "the plan was made with method `{m}`, not `{}` (metadata gradkit.method)",
                kind.name()
            );
        }
    }
    if let Some(w) = meta.and_then(|m| m.get("world_size")) {
        if w.parse::<usize>().ok() != Some(world) {
            bail!(
                "the plan was made for {w} workers but the trace has {world} ranks (metadata gradkit.world_size)"
            );
        }
    }
    let mut by_step: BTreeMap<u32, Vec<PlanRow>> = BTreeMap::new();
    for r in rows {
        by_step.entry(r.step).or_default().push(r);
    }
    let Some(&first) = by_step.keys().next() else {
        bail!("the plan has no rows");
    };
    if first > first_step {
        bail!(
            "the plan starts at step {first} but the trace at step {first_step}: steps before {first} have no plan (column `step`)"
        );
    }
    for (&s, rows) in &by_step {
        check_step(kind, layout, world, s, rows)?;
    }
    Ok(Plan {
        steps: by_step.into_iter().collect(),
    })
}

/// Checks the rows of one plan step (see the module doc).
pub fn check_step<R: Borrow<PlanRow>>(
    kind: PlanKind,
    layout: &Layout,
    world: usize,
    step: u32,
    rows: &[R],
) -> Result<()> {
    ensure!(!rows.is_empty(), "plan step {step} has no rows");
    let rows: Vec<&PlanRow> = rows.iter().map(Borrow::borrow).collect();
    for r in &rows {
        match (kind, r.k) {
            (PlanKind::Deft, None) => bail!(
                "plan step {step}: a row without k is an Ok-Topk region, not a DEFT range; make the plan with gradpartition --method deft (column `k`)"
            ),
            (PlanKind::Oktopk, Some(_)) => bail!(
                "plan step {step}: a row with k is a DEFT range, not an Ok-Topk region; make the plan with gradpartition --method oktopk (column `k`)"
            ),
            _ => {}
        }
    }
    let workers = rows.iter().map(|r| r.worker as usize).max().unwrap_or(0) + 1;
    if workers != world {
        bail!("plan step {step} has {workers} workers but the trace has {world} ranks (column `worker`)");
    }
    let tiles = tiles(layout, step, &rows)?;
    check_tiling(layout, step, &tiles)?;
    if kind == PlanKind::Oktopk && !tiles.windows(2).all(|t| t[0].2 <= t[1].2) {
        bail!("plan step {step}: the Ok-Topk regions are not contiguous in worker order (column `worker`)");
    }
    Ok(())
}

/// (flat start, flat end, worker, layer name) of every non-empty range, sorted; each row's
/// layer and range checked against the trace's layout.
fn tiles<'a>(
    layout: &'a Layout,
    step: u32,
    rows: &[&PlanRow],
) -> Result<Vec<(u64, u64, u32, &'a str)>> {
    let mut tiles: Vec<(u64, u64, u32, &str)> = Vec::with_capacity(rows.len());
    for r in rows {
        let Some(l) = layout.by_id(r.layer_id) else {
            bail!(
                "plan step {step}: layer_id {} (`{}`) is not in the trace (column `layer_id`)",
                r.layer_id,
                r.layer
            );
        };
        if l.name != r.layer {
            bail!(
                "plan step {step}: layer_id {} is `{}` in the plan but `{}` in the trace (column `layer`)",
                r.layer_id,
                r.layer,
                l.name
            );
        }
        if r.start > r.end || r.end > l.numel {
            bail!(
                "plan step {step}: range {}..{} lies outside layer `{}` of {} elements (columns `start`, `end`)",
                r.start,
                r.end,
                l.name,
                l.numel
            );
        }
        if r.start < r.end {
            tiles.push((l.offset + r.start, l.offset + r.end, r.worker, &l.name));
        }
    }
    tiles.sort_unstable();
    Ok(tiles)
}

/// The sorted ranges tile the model: each flat position covered exactly once.
fn check_tiling(layout: &Layout, step: u32, tiles: &[(u64, u64, u32, &str)]) -> Result<()> {
    let mut pos = 0u64;
    for &(s, e, _, name) in tiles {
        if s != pos {
            let (what, at) = if s > pos {
                ("is not covered", pos)
            } else {
                ("is covered twice", s)
            };
            bail!(
                "plan step {step}: the ranges do not tile the model: flat position {at} {what} (layer `{}`; columns `start`, `end`)",
                if s > pos { layer_name(layout, pos) } else { name }
            );
        }
        pos = e;
    }
    let n = layout.total();
    if pos != n {
        bail!(
            "plan step {step}: the ranges do not tile the model: flat position {pos} is not covered (layer `{}`; columns `start`, `end`)",
            layer_name(layout, pos)
        );
    }
    Ok(())
}

fn layer_name(layout: &Layout, pos: u64) -> &str {
    let i = layout
        .layer_of(pos)
        .min(layout.layers.len().saturating_sub(1));
    layout.layers.get(i).map_or("", |l| l.name.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout::new(vec![(0, "a".into(), 10, None), (1, "b".into(), 6, None)])
    }

    fn row(worker: u32, layer_id: u32, start: u64, end: u64, k: Option<u64>) -> PlanRow {
        PlanRow {
            step: 0,
            worker,
            layer_id,
            layer: ["a", "b"][layer_id as usize].into(),
            start,
            end,
            k,
        }
    }

    fn deft(rows: Vec<PlanRow>) -> Result<Plan> {
        check(rows, None, PlanKind::Deft, &layout(), 2, 0)
    }

    #[test]
    fn a_tiling_is_accepted_and_gaps_overlaps_are_not() {
        let ok = vec![
            row(0, 0, 0, 10, Some(1)),
            row(1, 1, 0, 6, Some(1)),
            row(1, 1, 6, 6, Some(0)),
        ];
        assert!(deft(ok).is_ok());
        let gap = vec![row(0, 0, 0, 9, Some(1)), row(1, 1, 0, 6, Some(1))];
        let e = deft(gap).unwrap_err().to_string();
        assert!(e.contains("flat position 9 is not covered"), "{e}");
        let overlap = vec![
            row(0, 0, 0, 10, Some(1)),
            row(1, 0, 5, 10, Some(1)),
            row(1, 1, 0, 6, Some(1)),
        ];
        let e = deft(overlap).unwrap_err().to_string();
        assert!(e.contains("flat position 5 is covered twice"), "{e}");
        let short = vec![row(0, 0, 0, 10, Some(1)), row(1, 1, 0, 5, Some(1))];
        let e = deft(short).unwrap_err().to_string();
        assert!(e.contains("flat position 15 is not covered"), "{e}");
    }
}
