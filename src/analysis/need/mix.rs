//! What memory is made of at a moment of the projected step, by what a remedy can change: the
//! model's weights, the optimizer's state, gradients (kept from the last step or made in this
//! one), activations and other memory that grows with the micro-batch, and the rest. A
//! projection is a few such moments ([`Model`]); a remedy scales some parts ([`Change`]) and
//! the projected peak is the largest moment after the change.

use crate::analysis::categories::Category;

/// Bytes at one moment, by what a remedy can act on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mix {
    pub parameter: u64,
    pub optimizer_state: u64,
    /// Gradients alive from the last step (not freed by `zero_grad(set_to_none=True)`).
    pub kept_gradient: u64,
    /// Gradients made in this step's backward.
    pub gradient: u64,
    /// Tensors a forward saves for its backward.
    pub activation: u64,
    /// Everything else that grows with the micro-batch: temporaries of the forward and the
    /// backward, the batch, the loss.
    pub batch: u64,
    /// An inference KV cache: grows with the sequences and the tokens.
    pub kv_cache: u64,
    /// What a remedy leaves alone.
    pub fixed: u64,
}

impl Mix {
    pub fn total(&self) -> u64 {
        self.parameter
            + self.optimizer_state
            + self.kept_gradient
            + self.gradient
            + self.activation
            + self.batch
            + self.kv_cache
            + self.fixed
    }

    /// What does not grow with the micro-batch.
    pub fn unbatched(&self) -> u64 {
        self.total() - self.activation - self.batch - self.kv_cache
    }

    /// Adds `bytes` of memory of category `c`; `batched` says whether it grows with the
    /// micro-batch (made in a forward, a backward or by user code between them).
    pub fn add(&mut self, c: Category, bytes: u64, batched: bool, kept: bool) {
        match c {
            Category::Parameter => self.parameter += bytes,
            Category::OptimizerState => self.optimizer_state += bytes,
            Category::Gradient if kept => self.kept_gradient += bytes,
            Category::Gradient => self.gradient += bytes,
            Category::Activation => self.activation += bytes,
            Category::KvCache => self.kv_cache += bytes,
            _ if batched => self.batch += bytes,
            _ => self.fixed += bytes,
        }
    }

    /// The mix of a breakdown's categories (at a moment whose allocations' phases are not
    /// kept: activations, temporaries and inputs count as batch-sized).
    pub fn of_breakdown(b: &crate::analysis::breakdown::Breakdown) -> Mix {
        let mut m = Mix::default();
        for (c, bytes) in &b.categories {
            m.add(*c, *bytes, matches!(c, Category::Activation | Category::Temporary | Category::Input), true);
        }
        m
    }

    pub fn plus(&self, o: &Mix) -> Mix {
        Mix {
            parameter: self.parameter + o.parameter,
            optimizer_state: self.optimizer_state + o.optimizer_state,
            kept_gradient: self.kept_gradient + o.kept_gradient,
            gradient: self.gradient + o.gradient,
            activation: self.activation + o.activation,
            batch: self.batch + o.batch,
            kv_cache: self.kv_cache + o.kv_cache,
            fixed: self.fixed + o.fixed,
        }
    }

    /// This mix less `o`, part by part (never below zero).
    pub fn minus(&self, o: &Mix) -> Mix {
        Mix {
            parameter: self.parameter.saturating_sub(o.parameter),
            optimizer_state: self.optimizer_state.saturating_sub(o.optimizer_state),
            kept_gradient: self.kept_gradient.saturating_sub(o.kept_gradient),
            gradient: self.gradient.saturating_sub(o.gradient),
            activation: self.activation.saturating_sub(o.activation),
            batch: self.batch.saturating_sub(o.batch),
            kv_cache: self.kv_cache.saturating_sub(o.kv_cache),
            fixed: self.fixed.saturating_sub(o.fixed),
        }
    }

    /// The bytes after `change`.
    pub fn changed(&self, change: &Change) -> u64 {
        let f = |bytes: u64, factor: f64| (bytes as f64 * factor).round() as u64;
        let activation = f(self.activation, change.batch * change.activation);
        (self.parameter
            + f(self.optimizer_state, change.optimizer_state)
            + f(self.kept_gradient, change.kept_gradient)
            + self.gradient
            + activation
            + f(self.batch, change.batch)
            + f(self.kv_cache, change.batch * change.kv_cache)
            + self.fixed)
            .saturating_sub(change.less)
    }
}

/// What a remedy does to the parts of a [`Mix`]: factors, and bytes taken off the total.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Change {
    /// On activations and the other batch-sized memory: 0.5 for half the micro-batch.
    pub batch: f64,
    /// On activations alone (checkpointing keeps a fraction of them).
    pub activation: f64,
    pub optimizer_state: f64,
    pub kept_gradient: f64,
    /// On the KV cache alone (fewer tokens, a quantized or offloaded cache); fewer sequences
    /// act through `batch`.
    pub kv_cache: f64,
    /// Bytes taken off every moment (a leak stopped, a loss computed in chunks).
    pub less: u64,
}

impl Change {
    /// No change: the projection itself.
    pub const NONE: Change =
        Change { batch: 1.0, activation: 1.0, optimizer_state: 1.0, kept_gradient: 1.0, kv_cache: 1.0, less: 0 };
}

/// The moments of a projected step: the peak after a change is the largest of them.
#[derive(Debug, Clone, Default)]
pub struct Model {
    pub moments: Vec<Mix>,
}

/// Moments kept: the highest ones, and the highest by what does not grow with the batch (where
/// the peak moves once activations shrink, such as the optimizer's step).
const KEEP_HIGHEST: usize = 96;
const KEEP_UNBATCHED: usize = 32;

impl Model {
    /// A model of the given moments, keeping the few that can be the peak under some change.
    pub fn of(mut moments: Vec<Mix>) -> Model {
        if moments.len() > KEEP_HIGHEST + KEEP_UNBATCHED {
            moments.sort_by_key(|m| std::cmp::Reverse(m.total()));
            let mut rest = moments.split_off(KEEP_HIGHEST);
            rest.sort_by_key(|m| std::cmp::Reverse(m.unbatched()));
            rest.truncate(KEEP_UNBATCHED);
            moments.extend(rest);
        }
        Model { moments }
    }

    /// The peak of allocated bytes after `change`.
    pub fn peak(&self, change: &Change) -> u64 {
        self.moments.iter().map(|m| m.changed(change)).max().unwrap_or(0)
    }

    /// The moment at the peak, unchanged.
    pub fn at_peak(&self) -> Mix {
        self.moments.iter().max_by_key(|m| m.total()).copied().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_moves_to_the_optimizer_once_activations_shrink() {
        let forward_end = Mix { parameter: 10, optimizer_state: 20, activation: 60, ..Mix::default() };
        let optimizer = Mix { parameter: 10, optimizer_state: 20, gradient: 10, fixed: 30, ..Mix::default() };
        let m = Model::of(vec![forward_end, optimizer]);
        assert_eq!(m.peak(&Change::NONE), 90);
        let half = Change { batch: 0.5, ..Change::NONE };
        assert_eq!(m.peak(&half), 70, "half the activations: 60, but the optimizer's moment is 70");
        let lighter = Change { optimizer_state: 0.25, ..Change::NONE };
        assert_eq!(m.peak(&lighter), 75);
    }

    #[test]
    fn keeping_few_moments_keeps_the_ones_that_can_peak() {
        let mut moments: Vec<Mix> =
            (0..1000).map(|i| Mix { activation: 1000 + i, parameter: 10, ..Mix::default() }).collect();
        moments.push(Mix { fixed: 900, parameter: 10, ..Mix::default() });
        let m = Model::of(moments);
        assert!(m.moments.len() <= KEEP_HIGHEST + KEEP_UNBATCHED);
        assert_eq!(m.peak(&Change::NONE), 2009);
        assert_eq!(m.peak(&Change { batch: 0.0, ..Change::NONE }), 910, "the unbatched moment is kept");
    }
}
