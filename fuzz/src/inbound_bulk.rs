//! `inbound_bulk`: [`crate::inbound`]'s operations and model after one initiator completed
//! more transfers than [`mori_io_core::inbound::MAX_FINISHED`], so that the table has dropped
//! its oldest records (input: `[initiator] [extra] operations...`; tens of milliseconds an
//! input).

/// One input.
pub fn run(data: &[u8]) {
    crate::inbound::run_ops(data, true)
}

/// The operations of `inbound`'s seeds after bulk completions of two sizes.
pub fn seeds() -> Vec<Vec<u8>> {
    let ops = crate::inbound::seeds();
    ops.iter().zip([[2u8, 0], [3, 200]].iter().cycle()).map(|(o, b)| [&b[..], o].concat()).collect()
}

/// No dictionary (binary format).
pub fn dict() -> Vec<&'static str> {
    Vec::new()
}
