//! What the process asks of the machine it runs on: its memory pages and the allocator's
//! tuning ([`pages`]), and whether a second core is free now ([`cores`]). The stages decide how
//! to work from what is measured here, not from a count of cores.

pub mod cores;
pub(crate) mod pages;
