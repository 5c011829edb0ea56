//! The memory budget for analyses, in MiB permits of a semaphore: an analysis holds what its
//! parse is estimated to need before it starts, and what the parsed model really needs before
//! it is analysed.
//!
//! On glibc, memory an analysis frees stays in the arena of the thread that freed it, and the
//! next analysis, on another blocking thread, takes fresh pages: the process's RSS then climbs
//! past the budget though the live bytes stay within it. Two arenas ([`Budget::new`]) and a
//! trim after each analysis ([`trim`]) keep RSS close to what is live.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Memory of the budget held (None: the budget was closed).
pub type Held = Option<OwnedSemaphorePermit>;

/// What an analysis holds, and the bytes that was reckoned to be.
pub struct Charged {
    /// The permits.
    pub held: Held,
    /// The bytes they were taken for (the estimate from the file's size, at first).
    pub bytes: u64,
}

#[derive(Clone)]
pub struct Budget {
    memory: Arc<Semaphore>,
    mib: u32,
}

impl Budget {
    /// A budget of `bytes` (64 MiB at least), and the allocator tuned to keep RSS near it.
    pub fn new(bytes: u64) -> Budget {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: mallopt only sets a tuning parameter of the allocator.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
        Budget::untuned(bytes)
    }

    fn untuned(bytes: u64) -> Budget {
        let mib = (bytes >> 20).clamp(64, u32::MAX as u64 >> 4) as u32;
        Budget { memory: Arc::new(Semaphore::new(mib as usize)), mib }
    }

    /// The whole budget, in bytes: what one analysis may take at most.
    pub fn total(&self) -> u64 {
        (self.mib as u64) << 20
    }

    /// Bytes of the budget free now.
    pub fn free(&self) -> u64 {
        (self.memory.available_permits() as u64) << 20
    }

    fn mib_of(&self, bytes: u64) -> u32 {
        ((bytes >> 20) as u32).clamp(1, self.mib)
    }

    /// Waits until `bytes` are free and holds them (a request larger than the whole budget
    /// waits for all of it).
    pub async fn reserve(&self, bytes: u64) -> Held {
        self.memory.clone().acquire_many_owned(self.mib_of(bytes)).await.ok()
    }

    /// Holds `bytes` if they are free now.
    pub fn try_reserve(&self, bytes: u64) -> Held {
        self.memory.clone().try_acquire_many_owned(self.mib_of(bytes)).ok()
    }

    /// Holds `bytes` where `held` holds less: more at once if free, else by giving `held` back
    /// and waiting for the whole amount (two analyses each holding part and waiting for more
    /// would never move).
    pub async fn charge(&self, held: Charged, bytes: u64) -> Held {
        if bytes <= held.bytes {
            return held.held;
        }
        let mut permits = held.held?;
        match self.memory.clone().try_acquire_many_owned(self.mib_of(bytes - held.bytes)) {
            Ok(more) => {
                permits.merge(more);
                Some(permits)
            }
            Err(_) => {
                drop(permits);
                self.reserve(bytes).await
            }
        }
    }
}

/// Gives the pages freed by an analysis back to the OS (see the module's doc).
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory at the top of glibc's heaps.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two analyses that each hold part of the budget and find they need more both finish: one
    /// gives its part back and waits for the whole, rather than both waiting forever.
    #[tokio::test]
    async fn charging_more_than_was_reserved_never_deadlocks() {
        const MIB: u64 = 1 << 20;
        let budget = Budget::untuned(100 * MIB);
        let a = budget.reserve(60 * MIB).await;
        let b = budget.reserve(40 * MIB).await;
        let (ba, bb) = (budget.clone(), budget.clone());
        let ta = tokio::spawn(async move {
            let held = ba.charge(Charged { held: a, bytes: 60 * MIB }, 90 * MIB).await;
            assert_eq!(held.as_ref().map(|p| p.num_permits()), Some(90));
        });
        let tb = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let held = bb.charge(Charged { held: b, bytes: 40 * MIB }, 70 * MIB).await;
            assert_eq!(held.as_ref().map(|p| p.num_permits()), Some(70));
        });
        let both = async { (ta.await.unwrap(), tb.await.unwrap()) };
        tokio::time::timeout(std::time::Duration::from_secs(5), both).await.expect("both finish");
        assert_eq!(budget.free(), 100 * MIB, "everything given back");
    }
}
