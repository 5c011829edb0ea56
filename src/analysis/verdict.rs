//! The verdict in every form a reader meets it: its name in the JSON and the database, its
//! words and class on the pages, a device's headline, and where each remedy stands (the order
//! every view lists remedies in, and the badge). The pages and the command line take these as
//! they are; none of them words or orders a verdict or a remedy again.

use serde::{Deserialize, Serialize};

use super::DeviceAnalysis;
use super::advice::{Diagnosis, Effect, Remedy};
use crate::units::bytes;

/// What the diagnosis found, in one word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiagnosisVerdict {
    /// The request failed on memory the allocator held cached in pieces too small for it.
    Fragmentation,
    /// The step needed more than the budget.
    Capacity,
    /// The trace holds no OOM.
    NoOom,
}

impl DiagnosisVerdict {
    /// The name in the JSON and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            DiagnosisVerdict::Fragmentation => "fragmentation",
            DiagnosisVerdict::Capacity => "capacity",
            DiagnosisVerdict::NoOom => "no_oom",
        }
    }

    /// The verdict of a stored name (a database row's), if it is one.
    pub fn from_name(name: &str) -> Option<DiagnosisVerdict> {
        [DiagnosisVerdict::Fragmentation, DiagnosisVerdict::Capacity, DiagnosisVerdict::NoOom]
            .into_iter()
            .find(|v| v.as_str() == name)
    }

    /// How a list shows it.
    pub fn words(self) -> &'static str {
        match self {
            DiagnosisVerdict::Fragmentation => "fragmentation",
            DiagnosisVerdict::Capacity => "capacity",
            DiagnosisVerdict::NoOom => "no OOM",
        }
    }

    /// Its class on the pages (`verdict-CLASS` in a list).
    pub fn class(self) -> &'static str {
        match self {
            DiagnosisVerdict::Fragmentation => "fragmentation",
            DiagnosisVerdict::Capacity => "capacity",
            DiagnosisVerdict::NoOom => "no-oom",
        }
    }
}

/// How alarming a headline is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    /// Out of memory, and the allocator's waste is why.
    Bad,
    /// Out of memory for want of room, or memory that grows.
    Warn,
    /// Nothing to fix.
    Ok,
}

impl Tone {
    /// Its class on the pages.
    pub fn class(self) -> &'static str {
        match self {
            Tone::Bad => "bad",
            Tone::Warn => "warn",
            Tone::Ok => "ok",
        }
    }
}

/// A device's verdict as a title: what happened and, at an OOM, what the step needed of its
/// budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Headline {
    /// The title.
    pub words: String,
    /// How alarming it is.
    pub tone: Tone,
}

/// The headline of a device.
pub fn headline(d: &DeviceAnalysis) -> Headline {
    let need = &d.diagnosis.need;
    let against = match (need.peak_reserved_bytes, need.budget_bytes, d.ooms.first()) {
        (Some(n), Some(b), Some(_)) => format!(": the step needs {} of {}", bytes(n), bytes(b)),
        _ => String::new(),
    };
    let (words, tone) = match d.diagnosis.verdict {
        DiagnosisVerdict::Fragmentation => (format!("Out of memory: fragmentation{against}"), Tone::Bad),
        DiagnosisVerdict::Capacity => (format!("Out of memory: capacity{against}"), Tone::Warn),
        DiagnosisVerdict::NoOom if !d.memory.growth.is_empty() => {
            let per_step: u64 = d.memory.growth.iter().map(|g| g.bytes_per_step).sum();
            (format!("No OOM yet, but memory grows {} a step", bytes(per_step)), Tone::Warn)
        }
        DiagnosisVerdict::NoOom => ("No OOM in this trace".to_string(), Tone::Ok),
    };
    Headline { words, tone }
}

/// Where a remedy stands for this run, best first: the order remedies are listed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Standing {
    /// The run would fit.
    Fixes,
    /// It applies; what it would do is not weighed.
    Applies,
    /// The run would get further, or keep less, but not fit.
    Helps,
    /// The run would die as early or earlier.
    DoesNotHelp,
    /// Not here.
    DoesNotApply,
}

impl Standing {
    /// The badge's words.
    pub fn label(self) -> &'static str {
        match self {
            Standing::Fixes => Effect::Fixes.label(),
            Standing::Applies => "applies",
            Standing::Helps => Effect::Helps.label(),
            Standing::DoesNotHelp => Effect::DoesNotHelp.label(),
            Standing::DoesNotApply => Effect::DoesNotApply.label(),
        }
    }

    /// Its class on the pages.
    pub fn class(self) -> &'static str {
        match self {
            Standing::Fixes => "fixes",
            Standing::Applies => "applies",
            Standing::Helps => "helps",
            Standing::DoesNotHelp => "nohelp",
            Standing::DoesNotApply => "no",
        }
    }
}

impl Remedy {
    /// Where it stands: its weighed effect, else whether it applies.
    pub fn standing(&self) -> Standing {
        match (self.fit.effect, self.applies) {
            (Some(Effect::Fixes), _) => Standing::Fixes,
            (Some(Effect::Helps), _) => Standing::Helps,
            (Some(Effect::DoesNotHelp), _) => Standing::DoesNotHelp,
            (Some(Effect::DoesNotApply), _) | (None, false) => Standing::DoesNotApply,
            (None, true) => Standing::Applies,
        }
    }
}

impl Diagnosis {
    /// Puts the remedies in the order every view lists them: what would fix the run first,
    /// then what applies unweighed, what helps, what does not help, what does not apply; each
    /// group as the analysis found them (least code change first).
    pub fn order_remedies(&mut self) {
        self.remedies.sort_by_key(Remedy::standing);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::advice::RemedyKind;

    #[test]
    fn names_read_back_and_remedies_order_by_standing() {
        for v in [DiagnosisVerdict::Fragmentation, DiagnosisVerdict::Capacity, DiagnosisVerdict::NoOom] {
            assert_eq!(DiagnosisVerdict::from_name(v.as_str()), Some(v));
        }
        assert_eq!(DiagnosisVerdict::from_name("queued"), None);
        let remedy = |kind, applies, effect| {
            let mut r = Remedy::new(kind, applies, String::new(), String::new());
            r.fit.effect = effect;
            r
        };
        let mut d = Diagnosis {
            verdict: DiagnosisVerdict::Capacity,
            summary: String::new(),
            remedies: vec![
                remedy(RemedyKind::ExpandableSegments, false, None),
                remedy(RemedyKind::MaxSplitSize, true, Some(Effect::DoesNotHelp)),
                remedy(RemedyKind::ActivationCheckpointing, true, Some(Effect::Helps)),
                remedy(RemedyKind::Mempool, true, None),
                remedy(RemedyKind::SmallerBatch, true, Some(Effect::Fixes)),
                remedy(RemedyKind::LighterOptimizer, true, Some(Effect::Fixes)),
            ],
            need: Default::default(),
            outside: None,
            kv_cache: None,
        };
        d.order_remedies();
        let kinds: Vec<RemedyKind> = d.remedies.iter().map(|r| r.kind).collect();
        assert_eq!(
            kinds,
            [
                RemedyKind::SmallerBatch,
                RemedyKind::LighterOptimizer,
                RemedyKind::Mempool,
                RemedyKind::ActivationCheckpointing,
                RemedyKind::MaxSplitSize,
                RemedyKind::ExpandableSegments
            ],
            "by standing, and as found within one"
        );
    }
}
