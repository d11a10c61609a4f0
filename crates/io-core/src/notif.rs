//! Target-side queue of notifications: short messages a peer attached to a transfer (or sent
//! alone), delivered once the transfer's data is in place, read with
//! `IoEngine::get_new_notifs` or waited for with `IoEngine::wait_notif`.
//!
//! The semantics follow NIXL's notifications (`notif_msg` on a transfer, `get_new_notifs()`
//! returning messages per remote agent): a target learns that a peer finished with a
//! request without knowing its transfer ids. The queue is bounded: a peer whose notification
//! does not fit is refused (the sender's status fails with `Refused` naming the limit), so
//! nothing is dropped silently.

use crate::error::{IoError, IoResult};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest notification message, bytes.
pub const MAX_NOTIF_LEN: usize = 64 << 10;

/// Most notifications kept unread at a target (all peers together) by default.
pub const DEFAULT_MAX_QUEUED: usize = 1 << 16;

/// Checks a message a caller wants to attach: `InvalidArgs` naming its length and
/// [`MAX_NOTIF_LEN`] when it is longer.
pub fn check_msg(msg: &[u8]) -> IoResult<()> {
    if msg.len() > MAX_NOTIF_LEN {
        return Err(IoError::invalid(format!("notif_msg is {} bytes, at most {MAX_NOTIF_LEN} are allowed", msg.len())));
    }
    Ok(())
}

/// The unread notifications of one engine, oldest first, with the key of the engine that sent
/// each. Thread-safe; waiters sleep on a condition variable.
pub struct NotifQueue {
    q: Mutex<VecDeque<(Arc<str>, Vec<u8>)>>,
    cv: Condvar,
    max: usize,
}

impl NotifQueue {
    /// An empty queue holding at most `max` unread messages (at least 1).
    pub fn new(max: usize) -> Self {
        NotifQueue { q: Mutex::new(VecDeque::new()), cv: Condvar::new(), max: max.max(1) }
    }

    /// Appends the messages `msgs` of engine `from`, in order, all or none.
    /// Errors: `InvalidArgs` for a message longer than [`MAX_NOTIF_LEN`] (a peer breaking the
    /// protocol); `Refused` when they do not fit, naming the limit and how many are unread.
    pub fn push(&self, from: &str, msgs: Vec<Vec<u8>>) -> IoResult<()> {
        for m in &msgs {
            check_msg(m)?;
        }
        if msgs.is_empty() {
            return Ok(());
        }
        let key: Arc<str> = Arc::from(from);
        let mut q = self.q.lock();
        if q.len() + msgs.len() > self.max {
            return Err(IoError::refused(format!(
                "the target holds {} unread notifications, at most {} are kept; it must read them (get_new_notifs) before more are accepted",
                q.len(),
                self.max
            )));
        }
        q.extend(msgs.into_iter().map(|m| (key.clone(), m)));
        drop(q);
        self.cv.notify_all();
        Ok(())
    }

    /// Takes every unread message, grouped by sender, each sender's in arrival order.
    pub fn take_all(&self) -> HashMap<String, Vec<Vec<u8>>> {
        let drained: Vec<(Arc<str>, Vec<u8>)> = self.q.lock().drain(..).collect();
        let mut out: HashMap<String, Vec<Vec<u8>>> = HashMap::new();
        for (k, m) in drained {
            out.entry(k.to_string()).or_default().push(m);
        }
        out
    }

    /// Takes the oldest unread message, waiting up to `timeout` for one; `None` when none came.
    pub fn wait_next(&self, timeout: Duration) -> Option<(String, Vec<u8>)> {
        let deadline = Instant::now().checked_add(timeout);
        let mut q = self.q.lock();
        loop {
            if let Some((k, m)) = q.pop_front() {
                return Some((k.to_string(), m));
            }
            match deadline {
                Some(d) => {
                    if self.cv.wait_until(&mut q, d).timed_out() {
                        return q.pop_front().map(|(k, m)| (k.to_string(), m));
                    }
                }
                None => self.cv.wait(&mut q),
            }
        }
    }

    /// How many messages are unread.
    pub fn len(&self) -> usize {
        self.q.lock().len()
    }

    /// True when no message is unread.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use proptest::prelude::*;

    #[test]
    fn full_queue_refuses_all_or_nothing_and_names_the_limit() {
        let q = NotifQueue::new(3);
        q.push("a", vec![b"1".to_vec(), b"2".to_vec()]).unwrap();
        let e = q.push("b", vec![b"3".to_vec(), b"4".to_vec()]).unwrap_err();
        assert_eq!(e.code, ErrorCode::Refused);
        assert!(e.msg.contains("2 unread notifications, at most 3"), "{e}");
        assert_eq!(q.len(), 2, "nothing of the refused push was kept");
        q.push("b", vec![b"3".to_vec()]).unwrap();
        let all = q.take_all();
        assert_eq!(all["a"], vec![b"1".to_vec(), b"2".to_vec()]);
        assert_eq!(all["b"], vec![b"3".to_vec()]);
        assert!(q.is_empty());
    }

    #[test]
    fn long_message_is_refused_naming_the_limit() {
        let e = check_msg(&vec![0u8; MAX_NOTIF_LEN + 1]).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgs);
        assert!(e.msg.contains(&format!("{} bytes, at most {MAX_NOTIF_LEN}", MAX_NOTIF_LEN + 1)), "{e}");
        check_msg(&vec![0u8; MAX_NOTIF_LEN]).unwrap();
        let q = NotifQueue::new(4);
        assert!(q.push("a", vec![vec![0u8; MAX_NOTIF_LEN + 1]]).is_err());
        assert!(q.is_empty());
    }

    #[test]
    fn waiter_wakes_on_push_and_times_out_when_none_comes() {
        let q = Arc::new(NotifQueue::new(8));
        let t0 = Instant::now();
        assert_eq!(q.wait_next(Duration::from_millis(30)), None);
        assert!(t0.elapsed() >= Duration::from_millis(30));
        let q2 = q.clone();
        let h = std::thread::spawn(move || q2.wait_next(Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
        q.push("peer", vec![b"done".to_vec()]).unwrap();
        assert_eq!(h.join().unwrap(), Some(("peer".to_string(), b"done".to_vec())));
    }

    #[derive(Debug, Clone)]
    enum OpT {
        Push(u8, Vec<u8>),
        Pop,
        TakeAll,
    }

    fn op() -> impl Strategy<Value = OpT> {
        prop_oneof![
            3 => (0u8..3, proptest::collection::vec(1u8..5, 1..4)).prop_map(|(k, m)| OpT::Push(k, m)),
            1 => Just(OpT::Pop),
            1 => Just(OpT::TakeAll),
        ]
    }

    proptest! {
        /// Against a plain list of (sender, message): pops come oldest first, take_all returns
        /// every unread message per sender in order, a push that does not fit changes nothing.
        #[test]
        fn matches_a_list(ops in proptest::collection::vec(op(), 1..60), max in 1usize..8) {
            let q = NotifQueue::new(max);
            let mut oracle: Vec<(String, Vec<u8>)> = Vec::new();
            for o in ops {
                match o {
                    OpT::Push(k, lens) => {
                        let key = format!("e{k}");
                        let msgs: Vec<Vec<u8>> = lens.iter().map(|&n| vec![k; n as usize]).collect();
                        let r = q.push(&key, msgs.clone());
                        if oracle.len() + msgs.len() > max {
                            prop_assert!(r.is_err());
                        } else {
                            prop_assert!(r.is_ok());
                            oracle.extend(msgs.into_iter().map(|m| (key.clone(), m)));
                        }
                    }
                    OpT::Pop => {
                        let want = if oracle.is_empty() { None } else { Some(oracle.remove(0)) };
                        prop_assert_eq!(q.wait_next(Duration::ZERO), want);
                    }
                    OpT::TakeAll => {
                        let mut want: HashMap<String, Vec<Vec<u8>>> = HashMap::new();
                        for (k, m) in oracle.drain(..) {
                            want.entry(k).or_default().push(m);
                        }
                        prop_assert_eq!(q.take_all(), want);
                    }
                }
                prop_assert_eq!(q.len(), oracle.len());
            }
        }
    }
}
