//! A few worker threads that index prompts in the background.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread;

pub type Job = Box<dyn FnOnce() + Send + 'static>;

/// Fixed worker threads fed by a channel. Workers hold only the receiver, so dropping the
/// pool (the sender) lets them exit once the queue is drained.
pub struct Pool {
    tx: Mutex<Sender<Job>>,
}

impl Pool {
    /// Starts `threads` workers (at least one); fails if the OS refuses a thread (the ones
    /// already started exit, as nothing can reach them).
    pub fn new(threads: usize) -> std::io::Result<Self> {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx: Arc<Mutex<Receiver<Job>>> = Arc::clone(&rx);
            thread::Builder::new()
                .name(format!("lookahead-index-{i}"))
                .spawn(move || loop {
                    let job = {
                        let guard = rx.lock().unwrap_or_else(|e| e.into_inner());
                        guard.recv()
                    };
                    match job {
                        // Jobs catch their own panics; this one guards the worker itself.
                        Ok(job) => {
                            let _ = catch_unwind(AssertUnwindSafe(job));
                        }
                        Err(_) => break,
                    }
                })?;
        }
        Ok(Pool { tx: Mutex::new(tx) })
    }

    /// Another handle on the queue (the workers run until every handle is dropped).
    pub fn queue(&self) -> Sender<Job> {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Queues `job`; returns it back if the workers are gone (the caller runs it inline).
    pub fn submit(&self, job: Job) -> Option<Job> {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        tx.send(job).err().map(|e| e.0)
    }
}
