//! The pool's bookkeeping as a pure state machine: the `Pool` actor feeds it events and
//! carries out the [`Effect`]s it returns (create or destroy a container, answer a waiting
//! acquire). Pure, so the rules are tested by a model test without Docker or time.
//!
//! Rules:
//! - an instance is `Creating → Warm → Bound(session) → Gone` (or `Retiring` on its way out);
//!   it is bound at most once and never to a second session;
//! - `Creating + Warm + Bound + Retiring ≤ max_instances`, always;
//! - an acquire that finds no instance waits (FIFO) until one is warm or its deadline passes
//!   (then it is answered `Overloaded`);
//! - `min_instances` are kept warm or being created (the warmer), capacity allowing;
//! - a bound instance idle for `idle_timeout`, or used `max_use_count` times, is retired.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use messages::tenancy::tenant_of_scoped;
use tokio::time::Instant;

pub type InstanceId = u64;
pub type WaiterId = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub min_instances: usize,
    pub max_instances: usize,
    pub idle_timeout: Duration,
    /// Executions an instance serves before it is retired (0 = no limit).
    pub max_use_count: u64,
    /// How long an acquire waits for capacity before `Overloaded`.
    pub acquire_wait: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    Creating,
    Warm,
    Bound {
        session: String,
        last_used: Instant,
        uses: u64,
    },
    /// Unbound and being destroyed; still counts against the cap until it is gone.
    Retiring,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AcquireError {
    /// No capacity within the wait bound.
    #[error(
        "no AIO instance free: all {max} are in use and none came free within {waited:?}; \
         retry later"
    )]
    Overloaded { waited: Duration, max: usize },
    /// Creating an instance failed (the message has the cause's whole chain: it crossed from
    /// the task that tried).
    #[error("starting an AIO instance failed: {0}")]
    CreateFailed(String),
    /// The pool is stopping.
    #[error("the aio-pool is shutting down")]
    ShuttingDown,
}

/// What the actor must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Start creating a container for this (new) instance id.
    Create(InstanceId),
    /// Stop the instance and remove its container; answer [`Event::Gone`] when done.
    Destroy(InstanceId),
    /// Answer a waiting acquire.
    Answer(WaiterId, Result<InstanceId, AcquireError>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    Released,
    Idle,
    UsedUp,
    Died,
}

#[derive(Debug)]
struct Waiter {
    id: WaiterId,
    session: String,
    deadline: Instant,
}

/// Why an exec cannot go to an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UseError {
    /// The session has no bound instance (never acquired, released, reclaimed or retired).
    NotBound,
    /// The caller named an instance that is not the session's.
    WrongInstance { bound: InstanceId },
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub creating: usize,
    pub warm: usize,
    pub bound: usize,
    pub retiring: usize,
    pub waiting: usize,
}

impl Counts {
    pub fn total(&self) -> usize {
        self.creating + self.warm + self.bound + self.retiring
    }
}

#[derive(Debug)]
pub struct PoolState {
    limits: Limits,
    next_id: InstanceId,
    instances: BTreeMap<InstanceId, Phase>,
    by_session: HashMap<String, InstanceId>,
    waiters: VecDeque<Waiter>,
    /// Creations started for waiters, not yet finished: the warmer does not count them as
    /// future warm capacity, so waiters never starve the warm minimum and vice versa.
    creating_for_waiters: usize,
    stopping: bool,
}

impl PoolState {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            next_id: 1,
            instances: BTreeMap::new(),
            by_session: HashMap::new(),
            waiters: VecDeque::new(),
            creating_for_waiters: 0,
            stopping: false,
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn counts(&self) -> Counts {
        let mut c = Counts {
            waiting: self.waiters.len(),
            ..Counts::default()
        };
        for phase in self.instances.values() {
            match phase {
                Phase::Creating => c.creating += 1,
                Phase::Warm => c.warm += 1,
                Phase::Bound { .. } => c.bound += 1,
                Phase::Retiring => c.retiring += 1,
            }
        }
        c
    }

    pub fn phase(&self, id: InstanceId) -> Option<&Phase> {
        self.instances.get(&id)
    }

    pub fn bound_instance(&self, session: &str) -> Option<InstanceId> {
        self.by_session.get(session).copied()
    }

    /// Instances bound to, or awaited by, sessions whose ids start with `prefix` (one
    /// tenant's, ids being scoped by it): what a tenant's `aio_instances` quota counts.
    pub fn held_by(&self, prefix: &str) -> usize {
        let bound = self.by_session.keys().filter(|s| s.starts_with(prefix));
        let awaited = self
            .waiters
            .iter()
            .filter(|w| w.session.starts_with(prefix));
        bound.count() + awaited.count()
    }

    /// [`PoolState::held_by`] for every tenant at once (by the scoped ids' prefix), for the
    /// heartbeat: the other pools add it to their own count.
    pub fn held_per_tenant(&self) -> BTreeMap<String, u32> {
        let sessions = self.by_session.keys();
        let awaited = self.waiters.iter().map(|w| &w.session);
        let mut held = BTreeMap::new();
        for tenant in sessions.chain(awaited).filter_map(|s| tenant_of_scoped(s)) {
            *held.entry(tenant.as_str().to_string()).or_default() += 1;
        }
        held
    }

    fn new_instance(&mut self, fx: &mut Vec<Effect>) {
        let id = self.next_id;
        self.next_id += 1;
        self.instances.insert(id, Phase::Creating);
        fx.push(Effect::Create(id));
    }

    fn bind(&mut self, id: InstanceId, session: &str, now: Instant) {
        self.instances.insert(
            id,
            Phase::Bound {
                session: session.to_string(),
                last_used: now,
                uses: 0,
            },
        );
        self.by_session.insert(session.to_string(), id);
    }

    fn retire(&mut self, id: InstanceId, fx: &mut Vec<Effect>) {
        if let Some(Phase::Bound { session, .. }) = self.instances.get(&id) {
            self.by_session.remove(session);
        }
        if let Some(phase) = self.instances.get_mut(&id) {
            if *phase != Phase::Retiring {
                *phase = Phase::Retiring;
                fx.push(Effect::Destroy(id));
            }
        }
    }

    /// A session asks for its instance. Answered at once (bound or warm), or queued.
    pub fn acquire(&mut self, waiter: WaiterId, session: &str, now: Instant) -> Vec<Effect> {
        let mut fx = Vec::new();
        if self.stopping {
            fx.push(Effect::Answer(waiter, Err(AcquireError::ShuttingDown)));
            return fx;
        }
        if let Some(id) = self.bound_instance(session) {
            if let Some(Phase::Bound { last_used, .. }) = self.instances.get_mut(&id) {
                *last_used = now;
            }
            fx.push(Effect::Answer(waiter, Ok(id)));
            return fx;
        }
        self.waiters.push_back(Waiter {
            id: waiter,
            session: session.to_string(),
            deadline: now + self.limits.acquire_wait,
        });
        self.settle(now, &mut fx);
        fx
    }

    /// Serves waiters from warm instances, starts creations for the rest and tops up the
    /// warm minimum, all within the cap.
    fn settle(&mut self, now: Instant, fx: &mut Vec<Effect>) {
        while let Some(w) = self.waiters.front() {
            // A session may wait twice (a retry while the first acquire waits): the second
            // is answered with the instance the first got.
            if let Some(id) = self.bound_instance(&w.session) {
                let w = self.waiters.pop_front().expect("front exists");
                fx.push(Effect::Answer(w.id, Ok(id)));
                continue;
            }
            let warm = self
                .instances
                .iter()
                .find_map(|(id, p)| (*p == Phase::Warm).then_some(*id));
            let Some(id) = warm else { break };
            let w = self.waiters.pop_front().expect("front exists");
            self.bind(id, &w.session, now);
            fx.push(Effect::Answer(w.id, Ok(id)));
        }
        if self.stopping {
            return;
        }
        // Distinct sessions still waiting need that many instances.
        let mut sessions: Vec<&str> = self.waiters.iter().map(|w| w.session.as_str()).collect();
        sessions.sort_unstable();
        sessions.dedup();
        let counts = self.counts();
        let room = self.limits.max_instances.saturating_sub(counts.total());
        let for_waiters = sessions
            .len()
            .saturating_sub(self.creating_for_waiters)
            .min(room);
        for _ in 0..for_waiters {
            self.creating_for_waiters += 1;
            self.new_instance(fx);
        }
        let counts = self.counts();
        let future_warm = counts.warm + counts.creating - self.creating_for_waiters;
        let room = self.limits.max_instances.saturating_sub(counts.total());
        let top_up = self
            .limits
            .min_instances
            .saturating_sub(future_warm)
            .min(room);
        for _ in 0..top_up {
            self.new_instance(fx);
        }
    }

    /// A creation finished.
    pub fn created(
        &mut self,
        id: InstanceId,
        result: Result<(), String>,
        now: Instant,
    ) -> Vec<Effect> {
        let mut fx = Vec::new();
        if self.instances.get(&id) != Some(&Phase::Creating) {
            return fx;
        }
        if self.creating_for_waiters > 0 {
            self.creating_for_waiters -= 1;
        }
        match result {
            Ok(()) if self.stopping => self.retire(id, &mut fx),
            Ok(()) => {
                self.instances.insert(id, Phase::Warm);
                self.settle(now, &mut fx);
            }
            Err(message) => {
                self.instances.remove(&id);
                // The oldest waiter hears why; the others keep waiting for the next
                // attempt (the warmer's tick), within their own deadlines.
                if let Some(w) = self.waiters.pop_front() {
                    fx.push(Effect::Answer(
                        w.id,
                        Err(AcquireError::CreateFailed(message)),
                    ));
                }
            }
        }
        fx
    }

    /// The session gives its instance back: it is destroyed, never handed to another.
    /// `false` when the session had none.
    pub fn release(&mut self, session: &str, now: Instant) -> (bool, Vec<Effect>) {
        let mut fx = Vec::new();
        let Some(id) = self.bound_instance(session) else {
            return (false, fx);
        };
        self.retire(id, &mut fx);
        self.settle(now, &mut fx);
        (true, fx)
    }

    /// An execution is about to go to the session's instance: counts the use, and retires
    /// the instance after this one when it reached `max_use_count` (the returned flag).
    pub fn use_instance(
        &mut self,
        session: &str,
        named: Option<InstanceId>,
        now: Instant,
    ) -> Result<(InstanceId, bool), UseError> {
        let id = self.bound_instance(session).ok_or(UseError::NotBound)?;
        if named.is_some_and(|n| n != id) {
            return Err(UseError::WrongInstance { bound: id });
        }
        let Some(Phase::Bound {
            last_used, uses, ..
        }) = self.instances.get_mut(&id)
        else {
            return Err(UseError::NotBound);
        };
        *last_used = now;
        *uses += 1;
        let used_up = self.limits.max_use_count > 0 && *uses >= self.limits.max_use_count;
        if used_up {
            // Unbound now, so nothing else is routed to it; destroyed after this execution.
            self.by_session.remove(session);
            self.instances.insert(id, Phase::Retiring);
        }
        Ok((id, used_up))
    }

    /// An execution on the instance finished (keeps idle time honest for long runs).
    pub fn touch(&mut self, id: InstanceId, now: Instant) {
        if let Some(Phase::Bound { last_used, .. }) = self.instances.get_mut(&id) {
            *last_used = now;
        }
    }

    /// The periodic check: idle reclaim, waiters past their deadline, the warm minimum.
    pub fn tick(&mut self, now: Instant) -> Vec<Effect> {
        let mut fx = Vec::new();
        let idle: Vec<InstanceId> = self
            .instances
            .iter()
            .filter_map(|(id, p)| match p {
                Phase::Bound { last_used, .. }
                    if now.saturating_duration_since(*last_used) >= self.limits.idle_timeout =>
                {
                    Some(*id)
                }
                _ => None,
            })
            .collect();
        for id in idle {
            self.retire(id, &mut fx);
        }
        let max = self.limits.max_instances;
        let wait = self.limits.acquire_wait;
        self.waiters.retain(|w| {
            let expired = now >= w.deadline;
            if expired {
                fx.push(Effect::Answer(
                    w.id,
                    Err(AcquireError::Overloaded { waited: wait, max }),
                ));
            }
            !expired
        });
        // Creations for waiters that are gone now top up the warm set instead.
        self.creating_for_waiters = self.creating_for_waiters.min(self.waiters.len());
        self.settle(now, &mut fx);
        fx
    }

    /// The instance died on its own (health check, container gone).
    pub fn died(&mut self, id: InstanceId, now: Instant) -> Vec<Effect> {
        let mut fx = Vec::new();
        match self.instances.get(&id) {
            None | Some(Phase::Retiring) => {}
            Some(Phase::Creating) => return self.created(id, Err("instance died".into()), now),
            Some(_) => self.retire(id, &mut fx),
        }
        fx
    }

    /// A destroyed instance is gone: its capacity is free again.
    pub fn gone(&mut self, id: InstanceId, now: Instant) -> Vec<Effect> {
        let mut fx = Vec::new();
        if let Some(Phase::Bound { session, .. }) = self.instances.get(&id) {
            self.by_session.remove(session);
        }
        self.instances.remove(&id);
        self.settle(now, &mut fx);
        fx
    }

    /// Shutdown: waiters are answered, every instance is destroyed, nothing new is made.
    pub fn stop(&mut self) -> Vec<Effect> {
        self.stopping = true;
        let mut fx: Vec<Effect> = self
            .waiters
            .drain(..)
            .map(|w| Effect::Answer(w.id, Err(AcquireError::ShuttingDown)))
            .collect();
        let ids: Vec<InstanceId> = self
            .instances
            .iter()
            .filter(|(_, p)| **p != Phase::Creating)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.retire(id, &mut fx);
        }
        fx
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use proptest::prelude::*;

    use super::*;

    fn limits(min: usize, max: usize) -> Limits {
        Limits {
            min_instances: min,
            max_instances: max,
            idle_timeout: Duration::from_secs(300),
            max_use_count: 3,
            acquire_wait: Duration::from_secs(10),
        }
    }

    fn creates(fx: &[Effect]) -> Vec<InstanceId> {
        fx.iter()
            .filter_map(|e| match e {
                Effect::Create(id) => Some(*id),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn warms_the_minimum_and_binds_warm_instances_first() {
        let t = Instant::now();
        let mut s = PoolState::new(limits(2, 4));
        let fx = s.tick(t);
        let ids = creates(&fx);
        assert_eq!(ids.len(), 2);
        for id in &ids {
            s.created(*id, Ok(()), t);
        }
        assert_eq!(s.counts().warm, 2);
        let fx = s.acquire(10, "a", t);
        // Bound at once; one more is warmed to keep the minimum.
        assert_eq!(fx[0], Effect::Answer(10, Ok(ids[0])));
        assert_eq!(creates(&fx).len(), 1);
        // The same session gets the same instance.
        assert_eq!(s.acquire(11, "a", t), vec![Effect::Answer(11, Ok(ids[0]))]);
    }

    #[test]
    fn release_destroys_and_never_reuses() {
        let t = Instant::now();
        let mut s = PoolState::new(limits(0, 1));
        let fx = s.acquire(1, "a", t);
        let id = creates(&fx)[0];
        assert_eq!(s.created(id, Ok(()), t), vec![Effect::Answer(1, Ok(id))]);
        let (had, fx) = s.release("a", t);
        assert!(had);
        assert_eq!(fx, vec![Effect::Destroy(id)]);
        // While it is being destroyed it still counts: b waits, nothing is created.
        let fx = s.acquire(2, "b", t);
        assert!(fx.is_empty());
        let fx = s.gone(id, t);
        let next = creates(&fx);
        assert_eq!(next.len(), 1);
        assert_ne!(next[0], id);
        assert!(!s.release("a", t).0);
    }

    #[test]
    fn waiters_time_out_as_overloaded() {
        let t = Instant::now();
        let mut s = PoolState::new(limits(0, 1));
        let id = creates(&s.acquire(1, "a", t))[0];
        s.created(id, Ok(()), t);
        assert!(s.acquire(2, "b", t).is_empty());
        assert!(s.tick(t + Duration::from_secs(9)).is_empty());
        let fx = s.tick(t + Duration::from_secs(10));
        assert!(matches!(
            fx.as_slice(),
            [Effect::Answer(
                2,
                Err(AcquireError::Overloaded { max: 1, .. })
            )]
        ));
    }

    #[test]
    fn idle_and_used_up_instances_are_retired() {
        let t = Instant::now();
        let mut s = PoolState::new(limits(0, 2));
        let id = creates(&s.acquire(1, "a", t))[0];
        s.created(id, Ok(()), t);
        assert_eq!(s.use_instance("a", None, t), Ok((id, false)));
        assert_eq!(
            s.use_instance("a", Some(id + 100), t),
            Err(UseError::WrongInstance { bound: id })
        );
        let fx = s.tick(t + Duration::from_secs(300));
        assert_eq!(fx, vec![Effect::Destroy(id)]);
        assert_eq!(s.use_instance("a", None, t), Err(UseError::NotBound));

        let id = creates(&s.acquire(2, "b", t))[0];
        s.created(id, Ok(()), t);
        assert_eq!(s.use_instance("b", None, t), Ok((id, false)));
        assert_eq!(s.use_instance("b", None, t), Ok((id, false)));
        assert_eq!(s.use_instance("b", None, t), Ok((id, true)));
        assert_eq!(s.phase(id), Some(&Phase::Retiring));
        assert_eq!(s.use_instance("b", None, t), Err(UseError::NotBound));
    }

    #[tokio::test(start_paused = true)]
    async fn idle_reclaim_counts_from_the_last_use_on_paused_time() {
        let now = Instant::now;
        let mut s = PoolState::new(limits(0, 2));
        let id = creates(&s.acquire(1, "a", now()))[0];
        s.created(id, Ok(()), now());
        tokio::time::advance(Duration::from_secs(299)).await;
        assert!(s.tick(now()).is_empty());
        // A use resets the idle clock.
        s.use_instance("a", None, now()).unwrap();
        tokio::time::advance(Duration::from_secs(299)).await;
        assert!(s.tick(now()).is_empty());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(s.tick(now()), vec![Effect::Destroy(id)]);
        // The third use of a fresh instance (max_use_count 3) retires it at once.
        let next = creates(&s.acquire(2, "b", now()))[0];
        s.created(next, Ok(()), now());
        for expect in [false, false, true] {
            assert_eq!(s.use_instance("b", None, now()), Ok((next, expect)));
        }
    }

    #[test]
    fn a_failed_creation_answers_the_oldest_waiter() {
        let t = Instant::now();
        let mut s = PoolState::new(limits(0, 2));
        let id = creates(&s.acquire(1, "a", t))[0];
        let fx = s.created(id, Err("no image".into()), t);
        assert_eq!(
            fx,
            vec![Effect::Answer(
                1,
                Err(AcquireError::CreateFailed("no image".into()))
            )]
        );
        assert_eq!(s.counts().total(), 0);
    }

    // === model test ===

    #[derive(Debug, Clone)]
    enum Op {
        Acquire(u8),
        Release(u8),
        Use(u8),
        /// Finish the n-th creating instance (ok or failed).
        Finish(u8, bool),
        /// Finish the n-th destroy.
        Gone(u8),
        Died(u8),
        Tick(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..12).prop_map(Op::Acquire),
            2 => (0u8..12).prop_map(Op::Release),
            2 => (0u8..12).prop_map(Op::Use),
            4 => (any::<u8>(), prop::bool::weighted(0.9)).prop_map(|(n, ok)| Op::Finish(n, ok)),
            3 => any::<u8>().prop_map(Op::Gone),
            1 => any::<u8>().prop_map(Op::Died),
            2 => (0u16..400).prop_map(Op::Tick),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn never_exceeds_the_cap_never_shares_an_instance(
            min in 0usize..4, max in 1usize..6, ops in prop::collection::vec(op(), 1..120)
        ) {
            let mut s = PoolState::new(Limits { min_instances: min.min(max), ..limits(0, max) });
            let mut now = Instant::now();
            let mut next_waiter = 0u64;
            let mut open_waiters: HashMap<WaiterId, String> = HashMap::new();
            let mut owner: HashMap<InstanceId, String> = HashMap::new();
            let mut creating: Vec<InstanceId> = Vec::new();
            let mut destroying: Vec<InstanceId> = Vec::new();
            let mut destroyed: HashSet<InstanceId> = HashSet::new();
            let apply = |fx: Vec<Effect>, creating: &mut Vec<InstanceId>,
                             destroying: &mut Vec<InstanceId>,
                             open: &mut HashMap<WaiterId, String>,
                             owner: &mut HashMap<InstanceId, String>| -> Result<(), TestCaseError> {
                for e in fx {
                    match e {
                        Effect::Create(id) => creating.push(id),
                        Effect::Destroy(id) => {
                            prop_assert!(!destroying.contains(&id), "destroyed twice");
                            destroying.push(id);
                        }
                        Effect::Answer(w, result) => {
                            let session = open.remove(&w);
                            prop_assert!(session.is_some(), "waiter answered twice or unknown");
                            if let Ok(id) = result {
                                let session = session.unwrap();
                                // An instance belongs to the first session it was given to.
                                let first = owner.entry(id).or_insert_with(|| session.clone());
                                prop_assert_eq!(&*first, &session, "instance shared");
                            }
                        }
                    }
                }
                Ok(())
            };
            let fx = s.tick(now);
            apply(fx, &mut creating, &mut destroying, &mut open_waiters, &mut owner)?;
            for op in ops {
                let fx = match op {
                    Op::Acquire(n) => {
                        next_waiter += 1;
                        open_waiters.insert(next_waiter, format!("s{n}"));
                        s.acquire(next_waiter, &format!("s{n}"), now)
                    }
                    Op::Release(n) => s.release(&format!("s{n}"), now).1,
                    Op::Use(n) => {
                        if let Ok((id, _)) = s.use_instance(&format!("s{n}"), None, now) {
                            prop_assert_eq!(owner.get(&id), Some(&format!("s{n}")));
                            if s.phase(id) == Some(&Phase::Retiring) {
                                destroying.push(id);
                            }
                        }
                        Vec::new()
                    }
                    Op::Finish(i, ok) if !creating.is_empty() => {
                        let id = creating.remove(i as usize % creating.len());
                        s.created(id, if ok { Ok(()) } else { Err("x".into()) }, now)
                    }
                    Op::Gone(i) if !destroying.is_empty() => {
                        let id = destroying.remove(i as usize % destroying.len());
                        destroyed.insert(id);
                        s.gone(id, now)
                    }
                    Op::Died(i) => {
                        let ids: Vec<_> = owner.keys().copied().collect();
                        if ids.is_empty() { Vec::new() } else { s.died(ids[i as usize % ids.len()], now) }
                    }
                    Op::Tick(secs) => {
                        now += Duration::from_secs(secs as u64);
                        s.tick(now)
                    }
                    _ => Vec::new(),
                };
                apply(fx, &mut creating, &mut destroying, &mut open_waiters, &mut owner)?;
                let c = s.counts();
                prop_assert!(c.total() <= max, "{} instances > max {}", c.total(), max);
                // No instance is bound to two sessions, and every binding points back.
                let mut seen = HashSet::new();
                for (session, id) in &s.by_session {
                    prop_assert!(seen.insert(*id), "instance bound twice");
                    let bound_back = matches!(s.phase(*id), Some(Phase::Bound { session: b, .. }) if b == session);
                    prop_assert!(bound_back);
                    prop_assert!(!destroyed.contains(id));
                }
                prop_assert_eq!(c.waiting, s.waiters.len());
            }
            // Shutdown answers everyone still waiting.
            let fx = s.stop();
            apply(fx, &mut creating, &mut destroying, &mut open_waiters, &mut owner)?;
            prop_assert!(open_waiters.is_empty(), "waiters left unanswered: {:?}", open_waiters);
        }
    }
}
