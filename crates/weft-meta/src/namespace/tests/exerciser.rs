//! A differential exerciser: seeded random sequences of namespace calls (creates, opens, mkdirs, removes,
//! renames with every flag, links, symlinks, chmods, truncates, lookups, listings; as root and as a user; some
//! changes tagged with a once block and retried) run on `MemStore` and on `PgStore` side by side. Every answer must
//! be the same on both (inode numbers, layouts and times aside: PostgreSQL's sequence skips the numbers of
//! transactions that made nothing), every retry must get its first answer, the two trees must match at the end, and
//! the tree's own invariants (`check.rs`: link counts, one name per directory, parents, reachability) must hold
//! after every step.
//! A failure names the seed and the step; `WEFT_EXERCISER_SEED=N` replays one seed (`WEFT_EXERCISER_TRACE=1`
//! prints every step and its answer), `WEFT_EXERCISER_SEEDS=N` runs more of them (`make soak`).

use super::*;

/// Operations per seed.
const STEPS: usize = 150;
/// Seeds per `make test` run.
const SEEDS_DEFAULT: u64 = 6;
const NAMES: [&str; 4] = ["a", "b", "c", "d"];
const USER: u32 = 1000;

/// xorshift64*: small, seeded, the same on every machine.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<T: Copy>(&mut self, of: &[T]) -> T {
        of[self.below(of.len())]
    }
}

/// A path of one or two names below the root.
type Path = Vec<&'static str>;

#[derive(Debug, Clone)]
enum Step {
    Create { path: Path, exclusive: bool, open: bool },
    Mkdir { path: Path },
    Unlink { path: Path },
    Rmdir { path: Path },
    Rename { from: Path, to: Path, flags: u32 },
    Link { from: Path, to: Path },
    Symlink { path: Path },
    Chmod { path: Path, mode: u32 },
    Truncate { path: Path, size: u64 },
    Lookup { path: Path },
    Readdir { path: Path },
}

impl Step {
    fn random(rng: &mut Rng) -> Step {
        let path = |rng: &mut Rng| -> Path { (0..1 + rng.below(2)).map(|_| rng.pick(&NAMES)).collect() };
        // Weighted towards what makes names, so that sequences reach deeper trees.
        match rng.pick(&[0, 0, 0, 0, 1, 1, 2, 3, 4, 4, 5, 6, 7, 8, 9, 10]) {
            0 => Step::Create { path: path(rng), exclusive: rng.chance(50), open: rng.chance(50) },
            1 => Step::Mkdir { path: path(rng) },
            2 => Step::Unlink { path: path(rng) },
            3 => Step::Rmdir { path: path(rng) },
            4 => {
                let flags = rng.pick(&[0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE]);
                Step::Rename { from: path(rng), to: path(rng), flags }
            }
            5 => Step::Link { from: path(rng), to: path(rng) },
            6 => Step::Symlink { path: path(rng) },
            7 => Step::Chmod { path: path(rng), mode: rng.pick(&[0o755, 0o777, 0o700, 0o1777, 0o644, 0o444]) },
            8 => Step::Truncate { path: path(rng), size: rng.pick(&[0, 1, 4096, 1 << 20]) },
            9 => Step::Lookup { path: path(rng) },
            _ => Step::Readdir { path: path(rng) },
        }
    }

    fn is_change(&self) -> bool {
        !matches!(self, Step::Lookup { .. } | Step::Readdir { .. })
    }
}

/// What an answer says, without what legitimately differs between stores (inode numbers, layouts, times, data
/// versions).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Attr { kind: FileKind, mode: u32, uid: u32, gid: u32, nlink: u32, size: u64 },
    Entries(Vec<(String, FileKind)>),
    Done,
    Failed(ErrorCode),
}

fn seen_attr(a: &Attr) -> Seen {
    Seen::Attr { kind: a.kind, mode: a.mode, uid: a.uid, gid: a.gid, nlink: a.nlink, size: a.size }
}

fn seen(r: Result<Response, WireError>) -> Seen {
    match r {
        Err(e) => Seen::Failed(e.code),
        Ok(Response::Lookup(a) | Response::Create(a) | Response::Mkdir(a) | Response::Symlink(a)) => seen_attr(&a),
        Ok(Response::Link(a) | Response::SetAttr(a) | Response::GetAttr(a)) => seen_attr(&a),
        Ok(Response::Readdir(d)) => Seen::Entries(d.entries.into_iter().map(|e| (e.name, e.kind)).collect()),
        Ok(_) => Seen::Done,
    }
}

/// The directory holding `path`'s last name, and that name, looked up as `cred` from the root.
fn parent_of<S: MetaStore>(ns: &Ns<S>, cred: &Cred, path: &Path) -> Result<(u64, String), WireError> {
    let (last, dirs) = path.split_last().expect("a path has a name");
    let mut ino = ROOT_INO;
    for name in dirs {
        ino = match ns.execute_as(cred, &Request::Lookup(LookupReq { parent: ino, name: (*name).into() }))? {
            Response::Lookup(a) => a.ino,
            other => panic!("a lookup answered {other:?}"),
        };
    }
    Ok((ino, (*last).into()))
}

fn ino_of<S: MetaStore>(ns: &Ns<S>, cred: &Cred, path: &Path) -> Result<u64, WireError> {
    let (parent, name) = parent_of(ns, cred, path)?;
    match ns.execute_as(cred, &Request::Lookup(LookupReq { parent, name }))? {
        Response::Lookup(a) => Ok(a.ino),
        other => panic!("a lookup answered {other:?}"),
    }
}

/// The request `step` makes on `ns` (names resolved there), or the error resolving them met.
fn request<S: MetaStore>(ns: &Ns<S>, cred: &Cred, step: &Step) -> Result<Request, WireError> {
    Ok(match step {
        Step::Create { path, exclusive, .. } => {
            let (parent, name) = parent_of(ns, cred, path)?;
            Request::Create(CreateReq { parent, name, mode: 0o100644, exclusive: *exclusive })
        }
        Step::Mkdir { path } => {
            let (parent, name) = parent_of(ns, cred, path)?;
            Request::Mkdir(MkdirReq { parent, name, mode: 0o755 })
        }
        Step::Unlink { path } => {
            let (parent, name) = parent_of(ns, cred, path)?;
            Request::Unlink(NameReq { parent, name })
        }
        Step::Rmdir { path } => {
            let (parent, name) = parent_of(ns, cred, path)?;
            Request::Rmdir(NameReq { parent, name })
        }
        Step::Rename { from, to, flags } => {
            let (src_parent, src_name) = parent_of(ns, cred, from)?;
            let (dst_parent, dst_name) = parent_of(ns, cred, to)?;
            Request::Rename(RenameReq { src_parent, src_name, dst_parent, dst_name, flags: *flags })
        }
        Step::Link { from, to } => {
            let ino = ino_of(ns, cred, from)?;
            let (new_parent, new_name) = parent_of(ns, cred, to)?;
            Request::Link(LinkReq { ino, new_parent, new_name })
        }
        Step::Symlink { path } => {
            let (parent, name) = parent_of(ns, cred, path)?;
            Request::Symlink(SymlinkReq { parent, name, target: "../x".into() })
        }
        Step::Chmod { path, mode } => {
            let set = SetAttrs { mode: Some(*mode), ..SetAttrs::default() };
            Request::SetAttr(SetAttrReq { ino: ino_of(ns, cred, path)?, set })
        }
        Step::Truncate { path, size } => {
            let set = SetAttrs { size: Some(*size), ..SetAttrs::default() };
            Request::SetAttr(SetAttrReq { ino: ino_of(ns, cred, path)?, set })
        }
        Step::Lookup { path } => {
            let (parent, name) = parent_of(ns, cred, path)?;
            Request::Lookup(LookupReq { parent, name })
        }
        Step::Readdir { path } => {
            Request::Readdir(ReaddirReq { ino: ino_of(ns, cred, path)?, after: String::new(), limit: 100 })
        }
    })
}

/// Runs `step` on `ns` as `cred`, tagged with `once` when given (and then once more, as a retry whose reply must
/// be the first one).
fn run<S: MetaStore>(ns: &Ns<S>, cred: &Cred, step: &Step, once: Option<&OnceCall>) -> Seen {
    let req = match request(ns, cred, step) {
        Ok(req) => req,
        Err(e) => return Seen::Failed(e.code),
    };
    let call = || match (&req, step) {
        (Request::Create(r), Step::Create { open: true, .. }) => ns.create_open(cred, r, once).map(Response::Create),
        _ => ns.execute_once(cred, &req, once),
    };
    let first = seen(call());
    if once.is_some() {
        assert_eq!(seen(call()), first, "a retry of {step:?} with its once block got another answer");
    }
    first
}

/// Every name below the root, depth first, with what a lookup of it says.
fn tree<S: MetaStore>(ns: &Ns<S>) -> Vec<(String, Seen)> {
    let mut out = Vec::new();
    let mut todo = vec![(ROOT_INO, String::new())];
    while let Some((dir, prefix)) = todo.pop() {
        let req = Request::Readdir(ReaddirReq { ino: dir, after: String::new(), limit: 100 });
        let Response::Readdir(list) = ns.execute_as(&Cred::root(), &req).expect("a listing") else {
            panic!("a readdir answered with another op")
        };
        for e in list.entries {
            let path = format!("{prefix}/{}", e.name);
            let looked = ns.execute_as(&Cred::root(), &Request::Lookup(LookupReq { parent: dir, name: e.name }));
            if e.kind == FileKind::Dir {
                todo.push((e.ino, path.clone()));
            }
            out.push((path, seen(looked)));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn exercise(seed: u64) {
    let (mem, _) = ns_of::<MemStore>();
    let (pg, _) = ns_of::<crate::PgStore>();
    let mut rng = Rng::new(seed);
    // The root open to the user too (sticky, as /tmp is), and a directory to start in.
    let mode = SetAttrs { mode: Some(0o1777), ..SetAttrs::default() };
    let open_root = Request::SetAttr(SetAttrReq { ino: ROOT_INO, set: mode });
    mem.execute_as(&Cred::root(), &open_root).expect("chmod of the root");
    pg.execute_as(&Cred::root(), &open_root).expect("chmod of the root");
    let start = Step::Mkdir { path: vec!["a"] };
    assert_eq!(run(&pg, &Cred::root(), &start, None), run(&mem, &Cred::root(), &start, None));
    let (mut call, mut changed) = (0, 0);
    for n in 0..STEPS {
        let step = Step::random(&mut rng);
        let cred = if rng.chance(25) { Cred::new(USER, USER, vec![]) } else { Cred::root() };
        let once = (step.is_change() && rng.chance(30)).then(|| {
            call += 1;
            OnceCall { tag: weft_proto::OnceTag { client: seed, call }, slot: 1, key_id: "k".into(), uid: cred.uid }
        });
        let on_mem = run(&mem, &cred, &step, once.as_ref());
        let on_pg = run(&pg, &cred, &step, once.as_ref());
        assert_eq!(on_pg, on_mem, "seed {seed} step {n}: {step:?} as uid {}: PgStore against MemStore", cred.uid);
        changed += usize::from(step.is_change() && !matches!(on_mem, Seen::Failed(_)));
        if std::env::var_os("WEFT_EXERCISER_TRACE").is_some() {
            eprintln!("{n}: {step:?} as uid {} -> {on_mem:?}", cred.uid);
        }
        if let Err(e) = mem.check_tree() {
            panic!("seed {seed} step {n}: {step:?} as uid {} left a broken tree on MemStore: {e}", cred.uid);
        }
    }
    // A sequence where nearly everything fails compares little: the generator must keep making changes.
    assert!(changed >= STEPS / 15, "seed {seed}: only {changed} of {STEPS} steps changed the namespace");
    eprintln!("namespace exerciser: seed {seed}: {changed} of {STEPS} steps changed the namespace");
    assert_eq!(tree(&pg), tree(&mem), "seed {seed}: the trees after {STEPS} steps, PgStore against MemStore");
    if let Err(e) = pg.check_tree() {
        panic!("seed {seed}: the tree on PgStore after {STEPS} steps is broken: {e}");
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| v.parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number")))
}

#[test]
fn random_operations_answer_alike_on_memory_and_postgresql() {
    if let Some(seed) = env_u64("WEFT_EXERCISER_SEED") {
        return exercise(seed);
    }
    // A new first seed each run (printed), so that runs together cover more sequences than any one.
    let base = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_secs());
    for seed in base..base + env_u64("WEFT_EXERCISER_SEEDS").unwrap_or(SEEDS_DEFAULT) {
        eprintln!("namespace exerciser: seed {seed} (replay: WEFT_EXERCISER_SEED={seed})");
        exercise(seed);
    }
}
