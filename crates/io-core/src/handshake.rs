//! The proofs of a connection's hello (sans-IO): HMAC-SHA-256 keyed by the listening engine's
//! secret over both sides' fresh nonces.
//!
//! 1. dialer -> listener: [`crate::wire::Hello`] with the dialer's nonce and its descriptor,
//!    secret blanked (no secret travels yet).
//! 2. listener -> dialer: `HelloReply::Challenge` with the listener's nonce and
//!    [`listener_proof`]: the dialer checks it with the secret its descriptor of the listener
//!    carries, and stops unless it matches, so an impostor at the address (a process that took
//!    a dead engine's port) learns nothing of ours.
//! 3. dialer -> listener: [`crate::wire::HelloAuth`] with [`dialer_proof`] and the dialer's own
//!    secret masked by [`mask`] (the listener needs it to dial back: deregistration notices).
//!    The listener checks the proof before serving anything.
//!
//! Fresh nonces on both sides make a recorded hello useless for a replay. An engine with
//! `MORI_IO_AUTH=off` has the secret [`Secret::NONE`]: the proofs are then computed with the
//! zero key and its listener takes any dialer proof.

use crate::desc::Secret;
use crate::error::IoResult;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// A proof: HMAC-SHA-256 output.
pub type Proof = [u8; 32];

fn mac(secret: &Secret, label: &[u8], a: u128, b: u128) -> Proof {
    // HMAC accepts keys of any length: new_from_slice cannot fail.
    let mut m = match Hmac::<Sha256>::new_from_slice(&secret.0.to_le_bytes()) {
        Ok(m) => m,
        Err(_) => return [0; 32],
    };
    m.update(label);
    m.update(&a.to_le_bytes());
    m.update(&b.to_le_bytes());
    m.finalize().into_bytes().into()
}

/// A fresh 128-bit nonce (`getrandom`). Errors: `Transport` when the random source fails.
pub fn nonce() -> IoResult<u128> {
    Secret::random().map(|s| s.0)
}

/// What the listener sends to prove it holds `secret` (its own).
pub fn listener_proof(secret: &Secret, dialer_nonce: u128, listener_nonce: u128) -> Proof {
    mac(secret, b"mori-io hello: listener", dialer_nonce, listener_nonce)
}

/// What the dialer sends to prove it holds `secret` (the listener's).
pub fn dialer_proof(secret: &Secret, dialer_nonce: u128, listener_nonce: u128) -> Proof {
    mac(secret, b"mori-io hello: dialer", listener_nonce, dialer_nonce)
}

/// `own` masked (and unmasked: the same call) with a key only holders of `secret` (the
/// listener's) can derive for these nonces.
pub fn mask(secret: &Secret, dialer_nonce: u128, listener_nonce: u128, own: Secret) -> Secret {
    let k = mac(secret, b"mori-io hello: mask", dialer_nonce, listener_nonce);
    let mut b = [0u8; 16];
    b.copy_from_slice(&k[..16]);
    Secret(own.0 ^ u128::from_le_bytes(b))
}

/// Compares two proofs without an early exit.
pub fn same(a: &Proof, b: &Proof) -> bool {
    crate::desc::ct_eq(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_need_the_secret_and_the_nonces() {
        let (s, t) = (Secret(0x1234), Secret(0x1235));
        let p = listener_proof(&s, 1, 2);
        assert!(same(&p, &listener_proof(&s, 1, 2)));
        assert!(!same(&p, &listener_proof(&t, 1, 2)), "another secret");
        assert!(!same(&p, &listener_proof(&s, 1, 3)), "another nonce");
        assert!(!same(&p, &dialer_proof(&s, 1, 2)), "the two directions differ");
        let own = Secret(0xdead_beef);
        let m = mask(&s, 1, 2, own);
        assert_ne!(m, own);
        assert_eq!(mask(&s, 1, 2, m), own);
        assert_ne!(mask(&t, 1, 2, m), own);
        assert!(nonce().unwrap() != nonce().unwrap());
    }
}
