//! The simulator and the leader loop decide the same commands (t50): the
//! pure simulator's tick against the replica's own `drive`.

use muster_core::sm::Resources;
use muster_sim::{SimConfig, Simulation};

const NODE: Resources = Resources { gpus: 8, vram_mb: 80_000, mem_mb: 1_024_000, cpus: 96 };

/// The simulator and the leader loop decide the same commands for the same
/// state and time: the simulator's tick, and the replica's own `drive` (the
/// leader loop's body) over a shell that applies to a local state.
#[tokio::test]
async fn t50_simulator_and_leader_loop_propose_the_same_commands() {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use muster_core::sm::{AllocSpec, ApplyCtx, Command, Event, NodeId, Outcome, State};
    use muster_core::tick::{Heard, LeaderConfig, PassTimers, Silence, Tick, TickTime, Wake};
    use muster_scheduler::server::ProposeError;
    use muster_scheduler::server::leader::{TickShell, drive};

    // A cluster with a bit of everything the tick decides: a node that went
    // silent holding work, a cancel whose agent never acked, queued gangs,
    // and a high-class gang that must preempt.
    let mut st = State::default();
    let mut t = 1_000;
    let ok = |st: &mut State, t: u64, cmd: Command| -> Vec<Event> {
        let out = st.apply(&cmd, &ApplyCtx { time_ms: t });
        assert!(out.is_accepted(), "{cmd:?}: {out:?}");
        out.events().to_vec()
    };
    for i in 0..6 {
        let node = NodeId::new(format!("n{i}"));
        ok(&mut st, t, Command::RegisterNode { node: node.clone(), resources: NODE, labels: BTreeMap::new() });
        ok(&mut st, t, Command::MarkNodeReady { node });
    }
    let submit = |st: &mut State, t: u64, gang: u32, gpus: u32, class: u8| {
        let mut spec = AllocSpec::new("u", gang, Resources { gpus, ..NODE }, vec!["x".into()]);
        spec.preemption_class = class;
        spec.walltime_s = if class == 0 && gpus < 4 { 60 } else { 3_600 };
        match ok(st, t, Command::Submit { spec })[..] {
            [Event::Submitted { alloc, .. }] => alloc,
            ref e => panic!("{e:?}"),
        }
    };
    let mut running = Vec::new();
    for i in 0..6 {
        let id = submit(&mut st, t, 1, 6, 0);
        let node = NodeId::new(format!("n{i}"));
        ok(&mut st, t, Command::ReserveGang { alloc: id, epoch: 1, nodes: vec![node.clone()] });
        ok(&mut st, t, Command::StartTask { alloc: id, task: 0, node, epoch: 1 });
        running.push(id);
    }
    t = 10_000;
    ok(&mut st, t, Command::CancelAllocation { alloc: running[1] });
    t = 400_000;
    submit(&mut st, t, 1, 2, 0);
    submit(&mut st, t, 2, 8, 9);
    let now = 400_000;
    let silent = NodeId::new("n0");

    // The simulator's tick.
    let cfg = SimConfig { nodes: 6, node: NODE, preemption: Some(Default::default()), ..SimConfig::default() };
    let down: BTreeMap<NodeId, u64> = [(silent.clone(), 0)].into();
    let (sim_cmds, sim_state) = Simulation::tick_once(cfg.clone(), st.clone(), now, down).unwrap();

    // The leader loop's drive, over a shell that applies what it proposes.
    struct Shell {
        state: Mutex<State>,
        heard: Heard,
        now: u64,
        proposed: Mutex<Vec<Command>>,
    }
    impl TickShell for Shell {
        fn read<R>(&self, f: impl FnOnce(&State) -> R) -> R {
            f(&self.state.lock().unwrap())
        }
        fn silence(&self) -> &(dyn Silence + Sync) {
            &self.heard
        }
        fn propose_all(
            &self,
            commands: Vec<Command>,
        ) -> impl Future<Output = Vec<Result<Outcome, ProposeError>>> + Send {
            let mut st = self.state.lock().unwrap();
            let out: Vec<_> = commands.iter().map(|c| Ok(st.apply(c, &ApplyCtx { time_ms: self.now }))).collect();
            self.proposed.lock().unwrap().extend(commands);
            std::future::ready(out)
        }
    }
    let mut heard = Heard::default();
    heard.lead_from(0);
    for i in 1..6 {
        heard.touch(&NodeId::new(format!("n{i}")), now);
    }
    let shell = Shell { state: Mutex::new(st), heard, now, proposed: Mutex::new(Vec::new()) };
    let leader = LeaderConfig {
        admission: cfg.admission,
        preemption: cfg.preemption.unwrap(),
        node_lost_after_ms: cfg.node_lost_after_ms,
        teardown_force_after_ms: cfg.force_teardown_ms,
        ..LeaderConfig::default()
    };
    let mut timers = PassTimers::default();
    let mut tick = Tick::begin(TickTime { wall_ms: now, mono_ms: now }, Wake { admission: true }, &mut timers, &leader);
    drive(&mut tick, &mut timers, &shell, &mut |_, _| {}).await;
    let leader_cmds = shell.proposed.into_inner().unwrap();

    let kinds: Vec<&str> = leader_cmds.iter().map(Command::name).collect();
    for want in ["mark_node_lost", "force_teardown", "reserve_gang", "preempt"] {
        assert!(kinds.contains(&want), "the scenario exercises {want}: {kinds:?}");
    }
    assert_eq!(sim_cmds, leader_cmds, "the simulator and the leader loop decided alike");
    assert_eq!(sim_state.state_digest(), shell.state.into_inner().unwrap().state_digest());
}
