//! NFSv4.1 on the gateway (crate weft-nfs, module nfs4) against a real cluster, driven by a small NFSv4.1 client
//! written here from the crate's own XDR code: session set-up, an open/write/commit/close and open/read/close
//! round trip with equal bytes (and the native client reading the same bytes), READDIR continued by cookie,
//! RENAME, REMOVE and the stale handle after it, share reservations, byte-range locks contending between two
//! NFSv4 clients and a native (FUSE-side) client, a replayed SEQUENCE answered from the slot, malformed
//! compounds answered with an error while the gateway keeps serving, a `kill -9` restart with its grace
//! period (reclaims allowed, new opens refused until it ends), and a killed gateway's locks adopted by its
//! successor: still held against a native client in grace, reclaimed by their NFS client, freed at grace's end
//! when nobody reclaimed them.

use crate::common;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use weft_launch::{NfsGateway, NfsOptions};
use weft_nfs::nfs4::attrs::{self, Bitmap};
use weft_nfs::nfs4::consts::*;
use weft_nfs::proto::NFS_PROGRAM;
use weft_nfs::rpc::{self, RecordLimits, ReplyHead};
use weft_nfs::xdr::{Reader, Writer};
use weft_proto::msg::{GetLockReq, LockClass, LockKind, SetLockReq};

const UID: u32 = 4242;

/// Seeded bytes (xorshift), so a failure reproduces.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// The ops of one compound being built.
#[derive(Default)]
struct Ops {
    w: Writer,
    n: u32,
    /// A READ or READDIR is among the ops: SEQUENCE does not ask for the reply to be cached (as Linux, which
    /// caches only non-idempotent compounds' replies; a large one would be REP_TOO_BIG_TO_CACHE).
    uncached: bool,
}

type Sid = (u32, [u8; 12]);

impl Ops {
    fn op(&mut self, code: u32) -> &mut Writer {
        self.n += 1;
        self.w.u32(code);
        &mut self.w
    }
    fn putrootfh(&mut self) -> &mut Self {
        self.op(OP_PUTROOTFH);
        self
    }
    fn putfh(&mut self, fh: &[u8]) -> &mut Self {
        self.op(OP_PUTFH).opaque(fh);
        self
    }
    fn lookup(&mut self, name: &str) -> &mut Self {
        self.op(OP_LOOKUP).opaque(name.as_bytes());
        self
    }
    fn getfh(&mut self) -> &mut Self {
        self.op(OP_GETFH);
        self
    }
    fn savefh(&mut self) -> &mut Self {
        self.op(OP_SAVEFH);
        self
    }
    fn getattr(&mut self, bits: &[u32]) -> &mut Self {
        let w = self.op(OP_GETATTR);
        Bitmap::of(bits).encode(w);
        self
    }
    /// OPEN by name in the current directory, creating (UNCHECKED, mode 0644) if `create`.
    fn open(&mut self, owner: &[u8], name: &str, access: u32, deny: u32, create: bool) -> &mut Self {
        let w = self.op(OP_OPEN);
        w.u32(0).u32(access).u32(deny).u64(0).opaque(owner);
        if create {
            w.u32(1).u32(0);
            Bitmap::of(&[attrs::MODE]).encode(w);
            let mut l = Writer::new();
            l.u32(0o644);
            w.opaque(&l.buf);
        } else {
            w.u32(0);
        }
        w.u32(0).opaque(name.as_bytes());
        self
    }
    fn open_previous(&mut self, owner: &[u8], access: u32) -> &mut Self {
        self.op(OP_OPEN).u32(0).u32(access).u32(0).u64(0).opaque(owner).u32(0).u32(1).u32(0);
        self
    }
    fn write(&mut self, sid: &Sid, offset: u64, stable: u32, data: &[u8]) -> &mut Self {
        self.op(OP_WRITE).u32(sid.0).fixed(&sid.1).u64(offset).u32(stable).opaque(data);
        self
    }
    fn read(&mut self, sid: &Sid, offset: u64, count: u32) -> &mut Self {
        self.uncached = true;
        self.op(OP_READ).u32(sid.0).fixed(&sid.1).u64(offset).u32(count);
        self
    }
    fn commit(&mut self) -> &mut Self {
        self.op(OP_COMMIT).u64(0).u32(0);
        self
    }
    fn close(&mut self, sid: &Sid) -> &mut Self {
        self.op(OP_CLOSE).u32(0).u32(sid.0).fixed(&sid.1);
        self
    }
    fn readdir(&mut self, cookie: u64, verf: &[u8; 8], maxcount: u32) -> &mut Self {
        self.uncached = true;
        let w = self.op(OP_READDIR);
        w.u64(cookie).fixed(verf).u32(maxcount).u32(maxcount);
        Bitmap::of(&[attrs::TYPE, attrs::FILEID]).encode(w);
        self
    }
    fn remove(&mut self, name: &str) -> &mut Self {
        self.op(OP_REMOVE).opaque(name.as_bytes());
        self
    }
    fn rename(&mut self, from: &str, to: &str) -> &mut Self {
        self.op(OP_RENAME).opaque(from.as_bytes()).opaque(to.as_bytes());
        self
    }
    fn mkdir(&mut self, name: &str) -> &mut Self {
        let w = self.op(OP_CREATE);
        w.u32(NF4DIR).opaque(name.as_bytes());
        Bitmap::default().encode(w);
        w.opaque(b"");
        self
    }
    /// LOCK with a new lock-owner from an open stateid.
    fn lock_new(&mut self, locktype: u32, off: u64, len: u64, open: &Sid, owner: &[u8]) -> &mut Self {
        let w = self.op(OP_LOCK);
        w.u32(locktype).bool(false).u64(off).u64(len).bool(true);
        w.u32(0).u32(open.0).fixed(&open.1).u32(0).u64(0).opaque(owner);
        self
    }
    /// LOCK reclaim = true with a new lock-owner from a reclaimed (CLAIM_PREVIOUS) open stateid.
    fn lock_reclaim(&mut self, locktype: u32, off: u64, len: u64, open: &Sid, owner: &[u8]) -> &mut Self {
        let w = self.op(OP_LOCK);
        w.u32(locktype).bool(true).u64(off).u64(len).bool(true);
        w.u32(0).u32(open.0).fixed(&open.1).u32(0).u64(0).opaque(owner);
        self
    }
    fn lock_existing(&mut self, locktype: u32, off: u64, len: u64, lock: &Sid) -> &mut Self {
        let w = self.op(OP_LOCK);
        w.u32(locktype).bool(false).u64(off).u64(len).bool(false).u32(lock.0).fixed(&lock.1).u32(0);
        self
    }
    fn lockt(&mut self, locktype: u32, off: u64, len: u64, owner: &[u8]) -> &mut Self {
        self.op(OP_LOCKT).u32(locktype).u64(off).u64(len).u64(0).opaque(owner);
        self
    }
    fn free_stateid(&mut self, sid: &Sid) -> &mut Self {
        self.op(OP_FREE_STATEID).u32(sid.0).fixed(&sid.1);
        self
    }
    fn locku(&mut self, off: u64, len: u64, lock: &Sid) -> &mut Self {
        self.op(OP_LOCKU).u32(WRITE_LT).u32(0).u32(lock.0).fixed(&lock.1).u64(off).u64(len);
        self
    }
}

/// A reply being read: the compound's status, then each op's code and status, then its body as the caller reads.
struct Res {
    buf: Vec<u8>,
    pos: usize,
    status: u32,
}

impl Res {
    fn with<T>(&mut self, f: impl FnOnce(&mut Reader<'_>) -> T) -> T {
        let mut r = Reader::new(&self.buf);
        r.fixed(self.pos).unwrap();
        let t = f(&mut r);
        self.pos = r.position();
        t
    }
    /// The next op's status (its code checked).
    fn op(&mut self, code: u32) -> u32 {
        self.with(|r| {
            assert_eq!(r.u32().unwrap(), code, "result op code");
            r.u32().unwrap()
        })
    }
    fn ok(&mut self, code: u32) {
        let s = self.op(code);
        assert_eq!(s, NFS4_OK, "op {code} failed");
    }
    fn seq(&mut self) {
        self.ok(OP_SEQUENCE);
        self.with(|r| {
            r.fixed(16 + 20).unwrap();
        });
    }
    fn sid(&mut self) -> Sid {
        self.with(|r| (r.u32().unwrap(), r.fixed(12).unwrap().try_into().unwrap()))
    }
    fn fh(&mut self) -> Vec<u8> {
        self.ok(OP_GETFH);
        self.with(|r| r.opaque(128).unwrap().to_vec())
    }
    /// OPEN's result: its stateid (the rest skipped).
    fn open(&mut self) -> Sid {
        self.ok(OP_OPEN);
        let sid = self.sid();
        self.with(|r| {
            r.fixed(4 + 16 + 4).unwrap();
            Bitmap::decode(r).unwrap();
            assert_eq!(r.u32().unwrap(), 0, "no delegation");
        });
        sid
    }
    fn attrs(&mut self) -> Vec<(u32, u64)> {
        self.ok(OP_GETATTR);
        self.with(|r| {
            let (b, l) = attrs::decode_raw(r).unwrap();
            attrs::decode_basic(&b, l).unwrap()
        })
    }
}

/// One NFSv4.1 client: a connection and (after `session`) a session with one slot used.
struct V4 {
    s: TcpStream,
    xid: u32,
    sid: [u8; 16],
    seqid: u32,
    clientid: u64,
    /// CREATE_SESSION's `csa_flags` (`session`), and the flags answered.
    cs_flags: u32,
    /// The AUTH_SYS uid (and gid) of every call.
    uid: u32,
}

impl V4 {
    async fn connect(addr: &str) -> V4 {
        V4::on(TcpStream::connect(addr).await.unwrap())
    }

    /// A client connected from local address `from` (another loopback address: another host to the gateway).
    async fn connect_from(addr: &str, from: std::net::Ipv4Addr) -> V4 {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind((from, 0).into()).unwrap();
        V4::on(sock.connect(addr.parse().unwrap()).await.unwrap())
    }

    fn on(s: TcpStream) -> V4 {
        V4 { s, xid: 0, sid: [0; 16], seqid: 0, clientid: 0, cs_flags: 0, uid: UID }
    }

    /// SEQUENCE, PUTROOTFH, LOOKUP "io", OPEN `name` for `owner` (made if `create`), GETFH, each checked: the
    /// open's stateid and the file's handle.
    async fn open_in_io(&mut self, owner: &[u8], name: &str, access: u32, create: bool) -> (Sid, Vec<u8>) {
        let args = self.seq_args(|o| {
            o.putrootfh().lookup("io").open(owner, name, access, 0, create).getfh();
        });
        let mut res = self.send(&args).await;
        res.seq();
        res.ok(OP_PUTROOTFH);
        res.ok(OP_LOOKUP);
        (res.open(), res.fh())
    }

    /// One RPC with raw COMPOUND arguments; the accepted reply's body.
    async fn rpc(&mut self, vers: u32, proc_: u32, args: &[u8]) -> (u32, Vec<u8>) {
        self.xid += 1;
        let mut w = rpc::encode_call(self.xid, NFS_PROGRAM, vers, proc_, Some((self.uid, self.uid, &[])));
        w.buf.extend_from_slice(args);
        self.s.write_all(&rpc::encode_record(&w.buf)).await.unwrap();
        let r = rpc::read_record(&mut self.s, &RecordLimits::default()).await.unwrap().expect("a reply");
        match rpc::parse_reply(&r).unwrap() {
            ReplyHead::Accepted { xid, stat, rest } => {
                assert_eq!(xid, self.xid);
                (stat, rest.to_vec())
            }
            other => panic!("denied: {other:?}"),
        }
    }

    /// A compound of `ops` (minor version 1) as raw bytes.
    fn args(minor: u32, ops: &Ops) -> Vec<u8> {
        let mut w = Writer::new();
        w.opaque(b"weft-test").u32(minor).u32(ops.n);
        w.buf.extend_from_slice(&ops.w.buf);
        w.buf
    }

    async fn send(&mut self, args: &[u8]) -> Res {
        let (stat, body) = self.rpc(4, 1, args).await;
        assert_eq!(stat, rpc::SUCCESS);
        let mut r = Reader::new(&body);
        let status = r.u32().unwrap();
        assert_eq!(r.opaque(1024).unwrap(), b"weft-test");
        r.u32().unwrap();
        let pos = r.position();
        Res { buf: body, pos, status }
    }

    /// A compound of SEQUENCE (next seqid, slot 0) then `f`'s ops.
    async fn seq(&mut self, f: impl FnOnce(&mut Ops)) -> Res {
        let args = self.seq_args(f);
        self.send(&args).await
    }

    /// SEQUENCE, PUTFH `fh`, then `f`'s ops; checks that SEQUENCE and PUTFH succeeded and returns the rest.
    async fn on_fh(&mut self, fh: &[u8], f: impl FnOnce(&mut Ops)) -> Res {
        let mut res = self
            .seq(|o| {
                f(o.putfh(fh));
            })
            .await;
        res.seq();
        res.ok(OP_PUTFH);
        res
    }

    fn seq_args(&mut self, f: impl FnOnce(&mut Ops)) -> Vec<u8> {
        self.seqid += 1;
        let mut rest = Ops::default();
        f(&mut rest);
        let mut ops = Ops::default();
        ops.op(OP_SEQUENCE).fixed(&self.sid).u32(self.seqid).u32(0).u32(0).bool(!rest.uncached);
        ops.w.buf.extend_from_slice(&rest.w.buf);
        ops.n += rest.n;
        V4::args(1, &ops)
    }

    /// EXCHANGE_ID, CREATE_SESSION, and (if `reclaim_complete`) RECLAIM_COMPLETE.
    async fn session(&mut self, owner: &[u8], reclaim_complete: bool) {
        let mut ops = Ops::default();
        let w = ops.op(OP_EXCHANGE_ID);
        w.fixed(&[7; 8]).opaque(owner).u32(0).u32(0).u32(0);
        let mut res = self.send(&V4::args(1, &ops)).await;
        res.ok(OP_EXCHANGE_ID);
        let (clientid, seq) = res.with(|r| (r.u64().unwrap(), r.u32().unwrap()));
        self.clientid = clientid;
        let mut ops = Ops::default();
        let w = ops.op(OP_CREATE_SESSION);
        w.u64(clientid).u32(seq).u32(self.cs_flags);
        w.u32(0).u32(1 << 20).u32(1 << 20).u32(8192).u32(16).u32(8).u32(0);
        w.u32(0).u32(4096).u32(4096).u32(0).u32(2).u32(1).u32(0);
        // cb_program; callback security: AUTH_NONE, then AUTH_SYS (machine "t", uid 0, gid 0, no groups).
        w.u32(0x4000_0000).u32(2).u32(0).u32(1).u32(0).opaque(b"t").u32(0).u32(0).u32(0);
        let mut res = self.send(&V4::args(1, &ops)).await;
        res.ok(OP_CREATE_SESSION);
        self.sid = res.with(|r| r.fixed(16).unwrap().try_into().unwrap());
        self.cs_flags = res.with(|r| {
            r.u32().unwrap();
            r.u32().unwrap()
        });
        self.seqid = 0;
        if reclaim_complete {
            let mut res = self
                .seq(|o| {
                    o.op(OP_RECLAIM_COMPLETE).bool(false);
                })
                .await;
            res.seq();
            res.ok(OP_RECLAIM_COMPLETE);
        }
    }

    /// The handle of a path below the root.
    async fn path_fh(&mut self, path: &[&str]) -> Vec<u8> {
        let mut res = self
            .seq(|o| {
                o.putrootfh();
                for p in path {
                    o.lookup(p);
                }
                o.getfh();
            })
            .await;
        res.seq();
        res.ok(OP_PUTROOTFH);
        for _ in path {
            res.ok(OP_LOOKUP);
        }
        res.fh()
    }
}

/// A gateway whose grace period is over at once (tests that are not about grace do not wait for it).
async fn gateway(c: &common::TestCluster) -> NfsGateway {
    let o = NfsOptions { extra_args: vec!["--nfs4-grace-ms".into(), "0".into()], ..NfsOptions::default() };
    c.start_nfs(&o).await.unwrap_or_else(|e| panic!("starting the gateway: {e}"))
}

async fn io_dir(c: &common::TestCluster) -> u64 {
    let client = c.client().await;
    let d = client.mkdir(1, "io", 0o777).await.unwrap();
    client.setattr(d.ino, weft_proto::SetAttrs { mode: Some(0o777), ..Default::default() }).await.unwrap();
    d.ino
}

/// Session set-up, a write/read round trip, readdir, rename, remove, share reservations, the reply cache and
/// malformed compounds.
#[tokio::test(flavor = "multi_thread")]
async fn v41_round_trip_namespace_replay_and_malformed() {
    let c = common::start("nfs4-io", 2).await;
    let io = io_dir(&c).await;
    let g = gateway(&c).await;
    let mut a = V4::connect(g.addr()).await;
    // NULL answers; a minor version other than 1 is refused before any session exists.
    assert_eq!(a.rpc(4, 0, &[]).await, (rpc::SUCCESS, vec![]));
    for minor in [0, 2] {
        let res = a.send(&V4::args(minor, &Ops::default())).await;
        assert_eq!(res.status, NFS4ERR_MINOR_VERS_MISMATCH);
    }
    // An op outside a session.
    let mut o = Ops::default();
    o.putrootfh();
    let mut res = a.send(&V4::args(1, &o)).await;
    assert_eq!((res.status, res.op(OP_PUTROOTFH)), (NFS4ERR_OP_NOT_IN_SESSION, NFS4ERR_OP_NOT_IN_SESSION));
    a.session(b"client-a", true).await;

    // The root's attributes as the Linux client asks at mount.
    let mut res = a
        .seq(|o| {
            o.putrootfh().getattr(&[attrs::SUPPORTED_ATTRS, attrs::TYPE, attrs::LEASE_TIME, attrs::MAXREAD]);
        })
        .await;
    res.seq();
    res.ok(OP_PUTROOTFH);
    let got = res.attrs();
    assert_eq!(got[1], (attrs::TYPE, NF4DIR as u64));
    assert_eq!(got[2], (attrs::LEASE_TIME, 90));
    assert_eq!(got[3], (attrs::MAXREAD, 1 << 20));

    // Create, write unaligned pieces UNSTABLE, commit, close.
    let data = pattern(300_001, 11);
    let (sid, fh) = a.open_in_io(b"owner-a", "data", OPEN4_SHARE_ACCESS_BOTH, true).await;
    for (i, chunk) in data.chunks(131_072).enumerate() {
        let mut res = a
            .on_fh(&fh, |o| {
                o.write(&sid, (i * 131_072) as u64, 0, chunk);
            })
            .await;
        res.ok(OP_WRITE);
        let (n, how) = res.with(|r| (r.u32().unwrap(), r.u32().unwrap()));
        assert_eq!((n as usize, how), (chunk.len(), 0));
    }
    let mut res = a
        .on_fh(&fh, |o| {
            o.commit().close(&sid);
        })
        .await;
    res.ok(OP_COMMIT);
    res.with(|r| r.fixed(8).map(|_| ()).unwrap());
    res.ok(OP_CLOSE);
    // A closed stateid is gone.
    let mut res = a
        .on_fh(&fh, |o| {
            o.read(&sid, 0, 10);
        })
        .await;
    assert_eq!(res.op(OP_READ), NFS4ERR_BAD_STATEID);

    // The native client reads the bytes NFS wrote and closed.
    let client = c.client().await;
    let f = client.open("/io/data", weft_client::OpenMode::Read).await.unwrap();
    assert_eq!(f.size(), data.len() as u64);
    let got = f.read_at(0, bytes::BytesMut::zeroed(data.len())).await.unwrap();
    assert!(got[..] == data[..], "the native client reads what NFSv4 wrote");

    // Open again for reading and read it back in pieces.
    let mut res = a
        .seq(|o| {
            o.putrootfh().lookup("io").open(b"owner-a", "data", OPEN4_SHARE_ACCESS_READ, 0, false);
        })
        .await;
    res.seq();
    res.ok(OP_PUTROOTFH);
    res.ok(OP_LOOKUP);
    let rsid = res.open();
    let mut back = Vec::new();
    loop {
        let mut res = a
            .on_fh(&fh, |o| {
                o.read(&rsid, back.len() as u64, 65_536);
            })
            .await;
        res.ok(OP_READ);
        let (eof, bytes) = res.with(|r| (r.bool().unwrap(), r.opaque(1 << 20).unwrap().to_vec()));
        back.extend_from_slice(&bytes);
        if eof {
            break;
        }
        assert!(!bytes.is_empty(), "a short read without eof");
    }
    assert!(back == data, "read back other bytes");
    // A write through a read-only open is refused.
    let mut res = a
        .on_fh(&fh, |o| {
            o.write(&rsid, 0, 2, b"x");
        })
        .await;
    assert_eq!(res.op(OP_WRITE), NFS4ERR_OPENMODE);

    // Share reservations: client B may not open for writing what A opened denying writes.
    let mut b = V4::connect(g.addr()).await;
    b.session(b"client-b", true).await;
    let mut res = a
        .on_fh(&fh, |o| {
            o.op(OP_OPEN_DOWNGRADE).u32(rsid.0).fixed(&rsid.1).u32(0).u32(1).u32(0);
        })
        .await;
    res.ok(OP_OPEN_DOWNGRADE);
    let rsid2 = res.sid();
    assert_eq!((rsid2.0, rsid2.1), (rsid.0 + 1, rsid.1), "a downgrade moves the seqid on");
    let mut res = a
        .seq(|o| {
            o.putrootfh().lookup("io").open(
                b"owner-a2",
                "data",
                OPEN4_SHARE_ACCESS_READ,
                OPEN4_SHARE_DENY_WRITE,
                false,
            );
        })
        .await;
    res.seq();
    res.ok(OP_PUTROOTFH);
    res.ok(OP_LOOKUP);
    let deny_sid = res.open();
    let mut res = b
        .seq(|o| {
            o.putrootfh().lookup("io").open(b"owner-b", "data", OPEN4_SHARE_ACCESS_WRITE, 0, false);
        })
        .await;
    res.seq();
    res.ok(OP_PUTROOTFH);
    res.ok(OP_LOOKUP);
    assert_eq!(res.op(OP_OPEN), NFS4ERR_SHARE_DENIED);
    let mut res = a
        .on_fh(&fh, |o| {
            o.close(&deny_sid).close(&rsid2);
        })
        .await;
    res.ok(OP_CLOSE);
    res.sid();
    res.ok(OP_CLOSE);

    // READDIR continued by cookie across small replies: every name once.
    for i in 0..20 {
        client.create(io, &format!("n{i:02}"), 0o644, true).await.unwrap();
    }
    let dir = a.path_fh(&["io"]).await;
    let (mut cookie, mut verf, mut names) = (0u64, [0u8; 8], Vec::new());
    for _ in 0..100 {
        let mut res = a
            .on_fh(&dir, |o| {
                o.readdir(cookie, &verf, 300);
            })
            .await;
        res.ok(OP_READDIR);
        let eof = res.with(|r| {
            verf = r.fixed(8).unwrap().try_into().unwrap();
            while r.bool().unwrap() {
                cookie = r.u64().unwrap();
                names.push(r.string(255).unwrap().to_string());
                let (b, l) = attrs::decode_raw(r).unwrap();
                assert_eq!(attrs::decode_basic(&b, l).unwrap().len(), 2);
            }
            r.bool().unwrap()
        });
        if eof {
            break;
        }
    }
    let mut want: Vec<String> = (0..20).map(|i| format!("n{i:02}")).collect();
    want.push("data".into());
    want.sort();
    names.sort();
    assert_eq!(names, want);
    // A cookie with another verifier.
    let mut res = a
        .on_fh(&dir, |o| {
            o.readdir(cookie, b"otherver", 4096);
        })
        .await;
    assert_eq!(res.op(OP_READDIR), NFS4ERR_NOT_SAME);

    // RENAME then REMOVE; the removed file's handle is stale.
    let mut res = a
        .on_fh(&dir, |o| {
            o.savefh().putfh(&dir).rename("data", "data2").lookup("data");
        })
        .await;
    res.ok(OP_SAVEFH);
    res.ok(OP_PUTFH);
    res.ok(OP_RENAME);
    res.with(|r| r.fixed(2 * 20).map(|_| ()).unwrap());
    assert_eq!(res.op(OP_LOOKUP), NFS4ERR_NOENT);
    let mut res = a
        .on_fh(&dir, |o| {
            o.remove("data2").putfh(&fh).getattr(&[attrs::SIZE]);
        })
        .await;
    res.ok(OP_REMOVE);
    res.with(|r| r.fixed(20).map(|_| ()).unwrap());
    res.ok(OP_PUTFH);
    assert_eq!(res.op(OP_GETATTR), NFS4ERR_STALE);
    assert!(client.lookup(io, "data2").await.is_err());

    // Exactly once: a CREATE retried on its slot with the same seqid gets the cached reply, byte for byte,
    // and the directory is made once (a second run would answer EXIST).
    let args = a.seq_args(|o| {
        o.putfh(&dir).mkdir("once");
    });
    let first = a.rpc(4, 1, &args).await;
    let again = a.rpc(4, 1, &args).await;
    assert_eq!(first, again);
    assert_eq!(u32::from_be_bytes(first.1[..4].try_into().unwrap()), NFS4_OK);
    assert!(client.lookup(io, "once").await.is_ok());
    // A seqid that skips one is misordered.
    a.seqid += 1;
    let mut res = a.seq(|_| {}).await;
    assert_eq!(res.op(OP_SEQUENCE), NFS4ERR_SEQ_MISORDERED);
    a.seqid -= 2;

    // Malformed compounds: an unknown op, truncated arguments, a hostile count, a SEQUENCE out of place, a
    // stateid of nothing; each is an error and the gateway keeps serving.
    let mut res = a
        .seq(|o| {
            o.op(9999);
        })
        .await;
    assert_eq!(res.status, NFS4ERR_OP_ILLEGAL);
    res.seq();
    assert_eq!(res.op(OP_ILLEGAL), NFS4ERR_OP_ILLEGAL);
    let mut args = a.seq_args(|o| {
        o.putfh(&dir).op(OP_LOOKUP).u32(1000);
    });
    args.truncate(args.len() - 2);
    let (_, body) = a.rpc(4, 1, &args).await;
    assert_eq!(u32::from_be_bytes(body[..4].try_into().unwrap()), NFS4ERR_BADXDR);
    let mut hostile = Writer::new();
    hostile.opaque(b"x").u32(1).u32(u32::MAX);
    let (_, body) = a.rpc(4, 1, &hostile.buf).await;
    assert_eq!(u32::from_be_bytes(body[..4].try_into().unwrap()), NFS4ERR_TOO_MANY_OPS);
    let (stat, _) = a.rpc(4, 1, &[0, 0, 0, 200]).await;
    assert_eq!(stat, rpc::GARBAGE_ARGS);
    let mut res = a
        .seq(|o| {
            o.putrootfh().op(OP_SEQUENCE).fixed(&[0; 16]).u32(1).u32(0).u32(0).bool(false);
        })
        .await;
    res.seq();
    res.ok(OP_PUTROOTFH);
    assert_eq!(res.op(OP_SEQUENCE), NFS4ERR_SEQUENCE_POS);
    let mut res = a
        .seq(|o| {
            o.op(OP_PUTFH).opaque(&[9; 36]);
        })
        .await;
    res.seq();
    assert_eq!(res.op(OP_PUTFH), NFS4ERR_BADHANDLE);
    // Still serving, on the same connection and the same session.
    let io_fh = a.path_fh(&["io"]).await;
    assert_eq!(io_fh, dir, "handles are the sealed, stable ones");
}

/// Byte-range locks: two NFSv4 clients and a native client (the FUSE mount's path to the MDS) see each other's
/// locks; LOCKT reports, LOCKU releases, CLOSE drops what is left.
#[tokio::test(flavor = "multi_thread")]
async fn v41_locks_contend_with_each_other_and_native_locks() {
    let c = common::start("nfs4-locks", 1).await;
    io_dir(&c).await;
    let g = gateway(&c).await;
    let mut a = V4::connect(g.addr()).await;
    a.session(b"lock-a", true).await;
    let mut b = V4::connect(g.addr()).await;
    b.session(b"lock-b", true).await;
    let open = |v: &mut V4, owner: &'static [u8]| {
        v.seq_args(|o| {
            o.putrootfh().lookup("io").open(owner, "lk", OPEN4_SHARE_ACCESS_BOTH, 0, true).getfh();
        })
    };
    let args = open(&mut a, b"oa");
    let mut res = a.send(&args).await;
    res.seq();
    res.ok(OP_PUTROOTFH);
    res.ok(OP_LOOKUP);
    let sa = res.open();
    let fh = res.fh();
    let args = open(&mut b, b"ob");
    let mut res = b.send(&args).await;
    res.seq();
    res.ok(OP_PUTROOTFH);
    res.ok(OP_LOOKUP);
    let sb = res.open();

    // A holds [0, 100) exclusively.
    let mut res = a
        .on_fh(&fh, |o| {
            o.lock_new(WRITE_LT, 0, 100, &sa, b"la");
        })
        .await;
    res.ok(OP_LOCK);
    let la = res.sid();
    // B conflicts inside it (DENIED names the range), LOCKT agrees, and B gets a range outside it.
    let mut res = b
        .on_fh(&fh, |o| {
            o.lock_new(WRITE_LT, 50, 10, &sb, b"lb");
        })
        .await;
    assert_eq!(res.op(OP_LOCK), NFS4ERR_DENIED);
    let (off, len, lt) = res.with(|r| (r.u64().unwrap(), r.u64().unwrap(), r.u32().unwrap()));
    assert_eq!((off, len, lt), (0, 100, WRITE_LT));
    let mut res = b
        .on_fh(&fh, |o| {
            o.lockt(READ_LT, 99, 1, b"lb");
        })
        .await;
    assert_eq!(res.op(OP_LOCKT), NFS4ERR_DENIED);
    let mut res = b
        .on_fh(&fh, |o| {
            o.lock_new(WRITE_LT, 200, 10, &sb, b"lb");
        })
        .await;
    res.ok(OP_LOCK);
    let lb = res.sid();

    // The native client (what the FUSE mount's locks go through) sees both NFS clients' locks.
    let native = c.client().await;
    let ino = native.resolve("/io/lk").await.unwrap().ino;
    let set = |start, end, kind| SetLockReq { ino, class: LockClass::Posix, kind, start, end, owner: 77, pid: 1 };
    let held = native.set_lock(set(10, 20, Some(LockKind::Shared))).await.unwrap();
    assert!(held.is_some(), "a native lock inside A's range conflicts");
    let held = native.set_lock(set(205, 205, Some(LockKind::Exclusive))).await.unwrap();
    assert!(held.is_some(), "a native lock inside B's range conflicts");
    // And an NFS client sees the native lock.
    assert_eq!(native.set_lock(set(1000, 1999, Some(LockKind::Exclusive))).await.unwrap(), None);
    let mut res = a
        .on_fh(&fh, |o| {
            o.lock_existing(READ_LT, 1500, 1, &la);
        })
        .await;
    assert_eq!(res.op(OP_LOCK), NFS4ERR_DENIED);
    native.set_lock(set(1000, 1999, None)).await.unwrap();

    // A unlocks: B now gets [50, 60).
    let mut res = a
        .on_fh(&fh, |o| {
            o.locku(0, 100, &la);
        })
        .await;
    res.ok(OP_LOCKU);
    let mut res = b
        .on_fh(&fh, |o| {
            o.lock_existing(WRITE_LT, 50, 10, &lb);
        })
        .await;
    res.ok(OP_LOCK);
    // B's CLOSE drops its locks: the native client then locks the whole file.
    let mut res = b
        .on_fh(&fh, |o| {
            o.close(&sb);
        })
        .await;
    res.ok(OP_CLOSE);
    let probe =
        GetLockReq { ino, class: LockClass::Posix, kind: LockKind::Exclusive, start: 0, end: u64::MAX, owner: 77 };
    assert_eq!(native.get_lock(probe).await.unwrap(), None, "every NFS lock is gone");
    // Zero-length and overflowing ranges are INVAL.
    let mut res = a
        .on_fh(&fh, |o| {
            o.lock_existing(WRITE_LT, 5, 0, &la);
        })
        .await;
    assert_eq!(res.op(OP_LOCK), NFS4ERR_INVAL);
}

/// A gateway started for the first time (its state directory holds no state file) has no client's state to
/// reclaim: it holds no grace period, so a new open is served at once, as knfsd does (issue 30: every open used to
/// wait 90 s after `weft up --nfs`); restarted on the same state directory, it holds its grace period again.
#[tokio::test(flavor = "multi_thread")]
async fn v41_a_first_start_holds_no_grace_period_and_a_restart_does() {
    let c = common::start("nfs4-first", 1).await;
    io_dir(&c).await;
    let state_dir = c.dir().join("nfs-state").display().to_string();
    // The default grace period (90 s): the test would wait that long if the first start held it.
    let args: Vec<String> = vec!["--state-dir".into(), state_dir];
    let mut g = c.start_nfs(&NfsOptions { extra_args: args.clone(), ..NfsOptions::default() }).await.unwrap();
    let addr = g.addr().to_string();
    let open_new = |name: &'static str| {
        move |o: &mut Ops| {
            o.putrootfh().lookup("io").open(b"o", name, OPEN4_SHARE_ACCESS_BOTH, 0, true);
        }
    };
    let mut a = V4::connect(&addr).await;
    a.session(b"first-a", true).await;
    let mut res = a.seq(open_new("f")).await;
    res.seq();
    res.ok(OP_PUTROOTFH);
    res.ok(OP_LOOKUP);
    res.open();
    assert!(c.log("nfs").contains("no grace period"), "the first start says why it holds no grace period");
    g.kill().await;
    let _g2 =
        c.start_nfs(&NfsOptions { listen: addr.clone(), extra_args: args, ..NfsOptions::default() }).await.unwrap();
    let mut b = V4::connect(&addr).await;
    b.session(b"first-b", true).await;
    let mut res = b.seq(open_new("g")).await;
    res.seq();
    res.ok(OP_PUTROOTFH);
    res.ok(OP_LOOKUP);
    assert_eq!(res.op(OP_OPEN), NFS4ERR_GRACE, "a restarted gateway holds its grace period for reclaims");
}

/// `kill -9` and a restart on the same port: the old session and clientid are unknown, handles still work, and
/// in the grace period a reclaim (CLAIM_PREVIOUS) is served while a new open waits (GRACE); after the client's
/// RECLAIM_COMPLETE it may reclaim no more.
#[tokio::test(flavor = "multi_thread")]
async fn v41_restart_gives_a_grace_period_for_reclaims() {
    let c = common::start("nfs4-grace", 1).await;
    io_dir(&c).await;
    let mut g = gateway(&c).await;
    let mut a = V4::connect(g.addr()).await;
    a.session(b"grace-a", true).await;
    let (sid, fh) = a.open_in_io(b"o", "f", OPEN4_SHARE_ACCESS_BOTH, true).await;
    let mut res = a
        .on_fh(&fh, |o| {
            o.write(&sid, 0, 2, b"before the crash");
        })
        .await;
    res.ok(OP_WRITE);
    let addr = g.addr().to_string();
    let old_clientid = a.clientid;
    g.kill().await;
    let o = NfsOptions {
        listen: addr.clone(),
        extra_args: vec!["--nfs4-grace-ms".into(), "600000".into()],
        ..NfsOptions::default()
    };
    let _g2 = c.start_nfs(&o).await.unwrap();
    let mut a2 = V4::connect(&addr).await;
    a2.sid = a.sid;
    a2.seqid = a.seqid;
    let mut res = a2
        .seq(|o| {
            o.putfh(&fh);
        })
        .await;
    assert_eq!(res.op(OP_SEQUENCE), NFS4ERR_BADSESSION);
    let mut ops = Ops::default();
    let w = ops.op(OP_CREATE_SESSION);
    w.u64(old_clientid).u32(2).u32(0);
    for _ in 0..2 {
        w.u32(0).u32(1 << 20).u32(1 << 20).u32(8192).u32(16).u32(8).u32(0);
    }
    w.u32(0).u32(0);
    let mut res = a2.send(&V4::args(1, &ops)).await;
    assert_eq!(res.op(OP_CREATE_SESSION), NFS4ERR_STALE_CLIENTID);
    // A new client record, then reclaims.
    a2.session(b"grace-a", false).await;
    let mut res = a2
        .seq(|o| {
            o.putrootfh().lookup("io").open(b"o2", "f", OPEN4_SHARE_ACCESS_READ, 0, false);
        })
        .await;
    res.seq();
    res.ok(OP_PUTROOTFH);
    res.ok(OP_LOOKUP);
    assert_eq!(res.op(OP_OPEN), NFS4ERR_GRACE, "a new open waits for the grace period");
    let mut res = a2
        .on_fh(&fh, |o| {
            o.open_previous(b"o", OPEN4_SHARE_ACCESS_BOTH).read(&(0, [0; 12]), 0, 100);
        })
        .await;
    let reclaimed = res.open();
    res.ok(OP_READ);
    let got = res.with(|r| {
        r.bool().unwrap();
        r.opaque(100).unwrap().to_vec()
    });
    assert_eq!(got, b"before the crash");
    let mut res = a2
        .on_fh(&fh, |o| {
            o.write(&reclaimed, 16, 2, b", after").op(OP_RECLAIM_COMPLETE).bool(false);
        })
        .await;
    res.ok(OP_WRITE);
    res.with(|r| r.fixed(16).map(|_| ()).unwrap());
    res.ok(OP_RECLAIM_COMPLETE);
    let mut res = a2
        .on_fh(&fh, |o| {
            o.open_previous(b"o3", OPEN4_SHARE_ACCESS_READ);
        })
        .await;
    assert_eq!(res.op(OP_OPEN), NFS4ERR_NO_GRACE);
    let client = c.client().await;
    let mut res = a2
        .on_fh(&fh, |o| {
            o.close(&reclaimed);
        })
        .await;
    res.ok(OP_CLOSE);
    let f = client.open("/io/f", weft_client::OpenMode::Read).await.unwrap();
    let got = f.read_at(0, bytes::BytesMut::zeroed(64)).await.unwrap();
    assert_eq!(&got[..], b"before the crash, after");
}

/// `kill -9` of a gateway holding an NFS client's locks, restarted on its state directory: the new process adopts
/// the old one's MDS locks, so a native (FUSE-side) client is still refused in the grace period; the NFS client
/// reclaims one range (LOCK reclaim = true, same lock-owner: the same MDS owner) and keeps it; the range it did
/// not reclaim becomes free when grace ends.
#[tokio::test(flavor = "multi_thread")]
async fn v41_killed_gateways_locks_are_adopted_reclaimed_and_the_rest_freed_after_grace() {
    let c = common::start("nfs4-adopt", 1).await;
    io_dir(&c).await;
    let state_dir = c.dir().join("nfs-state").display().to_string();
    let args =
        |grace_ms: &str| vec!["--nfs4-grace-ms".into(), grace_ms.into(), "--state-dir".into(), state_dir.clone()];
    let mut g = c.start_nfs(&NfsOptions { extra_args: args("0"), ..NfsOptions::default() }).await.unwrap();
    let addr = g.addr().to_string();
    // A second gateway on the same state directory would take the first one's locks: refused.
    let second = NfsOptions { extra_args: args("0"), ..NfsOptions::default() };
    assert!(c.start_nfs(&second).await.is_err(), "two gateways on one state directory");
    let mut a = V4::connect(&addr).await;
    a.session(b"adopt-a", true).await;
    let (open, fh) = a.open_in_io(b"o", "lk", OPEN4_SHARE_ACCESS_BOTH, true).await;
    for (off, owner) in [(0, &b"la"[..]), (1000, &b"lb"[..])] {
        let mut res = a
            .on_fh(&fh, |o| {
                o.lock_new(WRITE_LT, off, 100, &open, owner);
            })
            .await;
        res.ok(OP_LOCK);
    }
    let native = c.client().await;
    let ino = native.resolve("/io/lk").await.unwrap().ino;
    let set = |start, kind| SetLockReq { ino, class: LockClass::Posix, kind, start, end: start, owner: 77, pid: 1 };
    assert!(native.set_lock(set(50, Some(LockKind::Shared))).await.unwrap().is_some());

    g.kill().await;
    let grace = NfsOptions { listen: addr.clone(), extra_args: args("15000"), ..NfsOptions::default() };
    let _g2 = c.start_nfs(&grace).await.unwrap();
    // Adopted: both ranges are still held against everyone else while the client has not come back yet.
    assert!(native.set_lock(set(50, Some(LockKind::Shared))).await.unwrap().is_some(), "lost at the kill");
    assert!(native.set_lock(set(1050, Some(LockKind::Shared))).await.unwrap().is_some(), "lost at the kill");
    assert!(c.log("nfs").contains("adopted the previous gateway process's locks"));

    // The client's recovery: a new client record and session, the open and one of its two locks reclaimed.
    let mut a2 = V4::connect(&addr).await;
    a2.session(b"adopt-a", false).await;
    let mut res = a2
        .on_fh(&fh, |o| {
            o.open_previous(b"o", OPEN4_SHARE_ACCESS_BOTH);
        })
        .await;
    let reopened = res.open();
    let mut res = a2
        .on_fh(&fh, |o| {
            o.lock_reclaim(WRITE_LT, 0, 100, &reopened, b"la");
        })
        .await;
    res.ok(OP_LOCK);
    let la = res.sid();
    let mut res = a2
        .seq(|o| {
            o.op(OP_RECLAIM_COMPLETE).bool(false);
        })
        .await;
    res.seq();
    res.ok(OP_RECLAIM_COMPLETE);
    // LOCKT of the reclaiming owner: its own (adopted, reclaimed) range does not conflict with it.
    let mut res = a2
        .on_fh(&fh, |o| {
            o.lockt(WRITE_LT, 0, 100, b"la");
        })
        .await;
    res.ok(OP_LOCKT);

    // Grace ends: the range nobody reclaimed is freed (polled: the gateway's timer runs on its own clock), the
    // reclaimed one stays.
    let mut tries = 0;
    while native.set_lock(set(1050, Some(LockKind::Exclusive))).await.unwrap().is_some() {
        tries += 1;
        assert!(tries < 600, "the unreclaimed range was never freed");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(native.set_lock(set(50, Some(LockKind::Shared))).await.unwrap().is_some(), "the reclaimed range stays");
    assert!(c.log("nfs").contains("NFSv4 grace period over"));
    // And the client's unlock is of its own lock: the native client gets the range then.
    let mut res = a2
        .on_fh(&fh, |o| {
            o.locku(0, 100, &la);
        })
        .await;
    res.ok(OP_LOCKU);
    assert_eq!(native.set_lock(set(50, Some(LockKind::Exclusive))).await.unwrap(), None);
}

/// A process in an SQLite transaction on a FUSE mount (python3's `sqlite3`, the unix VFS: fcntl locks at 2^30,
/// `begin` being e.g. `BEGIN EXCLUSIVE`); it answers `LOCKED` once inside, and ends the transaction at stdin's EOF.
struct SqliteHolder(std::process::Child);

impl SqliteHolder {
    fn start(db: &std::path::Path, begin: &str) -> SqliteHolder {
        use std::io::BufRead;
        const PY: &str = "import sqlite3, sys\n\
            db = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)\n\
            db.execute(sys.argv[2])\n\
            print('LOCKED', flush=True)\n\
            sys.stdin.read()\n\
            db.execute('ROLLBACK')\n";
        let mut child = std::process::Command::new("python3")
            .args(["-c", PY])
            .arg(db)
            .arg(begin)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "LOCKED", "{begin} on {}", db.display());
        SqliteHolder(child)
    }

    fn end(mut self) {
        drop(self.0.stdin.take());
        assert!(self.0.wait().unwrap().success());
    }
}

impl Drop for SqliteHolder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether SQLite on a FUSE mount commits a write now (false: the database is locked; no busy timeout).
fn sqlite_writes(db: &std::path::Path) -> bool {
    const PY: &str = "import sqlite3, sys\n\
        db = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)\n\
        try:\n    db.execute('BEGIN IMMEDIATE'); db.execute('INSERT INTO t VALUES (1)'); db.execute('COMMIT')\n\
        except sqlite3.OperationalError as e:\n    sys.exit(11 if 'locked' in str(e) else 1)\n";
    let s = std::process::Command::new("python3").args(["-c", PY]).arg(db).status().unwrap();
    match s.code() {
        Some(0) => true,
        Some(11) => false,
        other => panic!("python3 sqlite3 failed: {other:?}"),
    }
}

/// SQLite's locks through a FUSE mount meet NFSv4.1 LOCKs on the same file, at SQLite's lock bytes (2^30: PENDING,
/// RESERVED, then the 510-byte SHARED range): what the VM's kernel client sends for an SQLite on the NFS mount.
#[tokio::test(flavor = "multi_thread")]
async fn v41_locks_contend_with_sqlite_on_a_fuse_mount() {
    const PENDING: u64 = 1 << 30;
    const SHARED_FIRST: u64 = PENDING + 2;
    const SHARED_SIZE: u64 = 510;
    let c = common::start("nfs4-sqlite", 1).await;
    io_dir(&c).await;
    let g = gateway(&c).await;
    let m = common::mount::Mount::start(&c, &common::test_dir("nfs4-sqlite-mnt"), &[]);
    let db = m.path("io/s.db");
    let db2 = db.clone();
    tokio::task::spawn_blocking(move || {
        let s = std::process::Command::new("sqlite3").arg(&db2).arg("CREATE TABLE t(x INTEGER);").status().unwrap();
        assert!(s.success(), "sqlite3 create");
        std::fs::set_permissions(&db2, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    })
    .await
    .unwrap();

    let mut v = V4::connect(g.addr()).await;
    v.session(b"sqlite-v", true).await;
    let (open, fh) = v.open_in_io(b"o", "s.db", OPEN4_SHARE_ACCESS_BOTH, false).await;

    // FUSE holds BEGIN EXCLUSIVE (a write lock on PENDING and on the SHARED range): NFS is denied a shared lock on
    // the SHARED range (what its own reader would take) and the PENDING byte; LOCKT agrees.
    let h = {
        let db = db.clone();
        tokio::task::spawn_blocking(move || SqliteHolder::start(&db, "BEGIN EXCLUSIVE")).await.unwrap()
    };
    let mut res = v
        .on_fh(&fh, |o| {
            o.lock_new(READ_LT, SHARED_FIRST, SHARED_SIZE, &open, b"lo");
        })
        .await;
    assert_eq!(res.op(OP_LOCK), NFS4ERR_DENIED, "a shared lock inside FUSE's EXCLUSIVE transaction");
    let (_, _, lt) = res.with(|r| (r.u64().unwrap(), r.u64().unwrap(), r.u32().unwrap()));
    assert_eq!(lt, WRITE_LT);
    let mut res = v
        .on_fh(&fh, |o| {
            o.lockt(WRITE_LT, PENDING, 1, b"lo");
        })
        .await;
    assert_eq!(res.op(OP_LOCKT), NFS4ERR_DENIED, "the PENDING byte is FUSE's");
    tokio::task::spawn_blocking(move || h.end()).await.unwrap();

    // Released: NFS takes what an EXCLUSIVE transaction holds (PENDING, RESERVED, the SHARED range), and SQLite on
    // FUSE cannot write; a shared lock on the SHARED range only (an NFS reader) still keeps FUSE's writer out at
    // commit; unlocked, FUSE writes.
    let mut res = v
        .on_fh(&fh, |o| {
            o.lock_new(WRITE_LT, PENDING, 2 + SHARED_SIZE, &open, b"lo");
        })
        .await;
    res.ok(OP_LOCK);
    let lock = res.sid();
    let db2 = db.clone();
    assert!(!tokio::task::spawn_blocking(move || sqlite_writes(&db2)).await.unwrap(), "FUSE wrote under NFS's lock");
    let mut res = v
        .on_fh(&fh, |o| {
            o.lock_existing(READ_LT, SHARED_FIRST, SHARED_SIZE, &lock);
        })
        .await;
    res.ok(OP_LOCK);
    let lock = res.sid();
    let mut res = v
        .on_fh(&fh, |o| {
            o.locku(PENDING, 2, &lock);
        })
        .await;
    res.ok(OP_LOCKU);
    let lock = res.sid();
    let db2 = db.clone();
    assert!(!tokio::task::spawn_blocking(move || sqlite_writes(&db2)).await.unwrap(), "FUSE committed past a reader");
    let mut res = v
        .on_fh(&fh, |o| {
            o.locku(0, u64::MAX, &lock);
        })
        .await;
    res.ok(OP_LOCKU);
    let db2 = db.clone();
    assert!(tokio::task::spawn_blocking(move || sqlite_writes(&db2)).await.unwrap(), "FUSE writes once NFS unlocked");
    // The Linux client frees a lock stateid (FREE_STATEID) after its last unlock, asynchronously, while the same
    // process may already lock again with the same lock-owner (the same stateid, reused): a free of a stateid
    // that holds a lock is LOCKS_HELD and releases nothing (it used to drop the lock, and SQLite's database in the
    // VM was then "malformed"); after a whole-file LOCKU it is freed.
    let mut res = v
        .on_fh(&fh, |o| {
            o.lock_new(READ_LT, SHARED_FIRST, SHARED_SIZE, &open, b"lo");
        })
        .await;
    res.ok(OP_LOCK);
    let again = res.sid();
    assert_eq!(again.1, lock.1, "the lock-owner's stateid on this file is reused");
    let mut res = v
        .seq(|o| {
            o.free_stateid(&again);
        })
        .await;
    res.seq();
    assert_eq!(res.op(OP_FREE_STATEID), NFS4ERR_LOCKS_HELD);
    let db2 = db.clone();
    assert!(!tokio::task::spawn_blocking(move || sqlite_writes(&db2)).await.unwrap(), "the free dropped the lock");
    let mut res = v
        .seq(|o| {
            o.locku(0, u64::MAX, &again);
        })
        .await;
    res.seq();
    res.ok(OP_LOCKU);
    let done = res.sid();
    let mut res = v
        .seq(|o| {
            o.free_stateid(&done);
        })
        .await;
    res.seq();
    res.ok(OP_FREE_STATEID);
    let mut res = v
        .on_fh(&fh, |o| {
            o.lock_existing(READ_LT, 0, 1, &done);
        })
        .await;
    assert_eq!(res.op(OP_LOCK), NFS4ERR_BAD_STATEID, "freed");
}

/// pNFS (docs/format.md §24): with 4 data servers serving NFS and the gateway's `--pnfs on`, EXCHANGE_ID says
/// USE_PNFS_MDS, GETATTR the files layout type and the stripe unit; LAYOUTGET of a plain file answers a dense
/// file layout whose handles are the data servers' (index i for stripe index i, the file's unit and count) and
/// whose device GETDEVICEINFO resolves to the servers' NFS addresses in stripe order; LAYOUTCOMMIT raises the
/// size at the MDS (and only raises it); LAYOUTRETURN forgets the layout; an ec file gets LAYOUTUNAVAILABLE;
/// bad iomodes, a too small maxcount and a forged device id are refused.
#[tokio::test(flavor = "multi_thread")]
async fn v41_pnfs_layouts_devices_commit_and_return() {
    use weft_nfs::nfs4::layout::*;
    const SERVERS: u32 = 4;
    const UNIT: u32 = 65536;
    let c = common::start_with("nfs4-pnfs", SERVERS, |o| o.ds_nfs = true).await;
    let client = c.client().await;
    let io = io_dir(&c).await;
    client.set_layout(io, UNIT, SERVERS).await.unwrap();
    let ec = client.mkdir(1, "ec", 0o777).await.unwrap();
    client.setattr(ec.ino, weft_proto::SetAttrs { mode: Some(0o777), ..Default::default() }).await.unwrap();
    client.set_layout_with(ec.ino, UNIT, 3, weft_proto::DataRedundancy::Ec { k: 2, m: 1 }).await.unwrap();
    let o = NfsOptions {
        extra_args: ["--nfs4-grace-ms", "0", "--pnfs", "on"].iter().map(|s| s.to_string()).collect(),
        ..NfsOptions::default()
    };
    let g = c.start_nfs(&o).await.unwrap();
    let mut v = V4::connect(g.addr()).await;
    let mut ops = Ops::default();
    ops.op(OP_EXCHANGE_ID).fixed(&[7; 8]).opaque(b"pnfs-client").u32(0).u32(0).u32(0);
    let mut res = v.send(&V4::args(1, &ops)).await;
    res.ok(OP_EXCHANGE_ID);
    let flags = res.with(|r| {
        r.fixed(12).unwrap();
        r.u32().unwrap()
    });
    assert_eq!(flags & (EXCHGID4_FLAG_USE_PNFS_MDS | EXCHGID4_FLAG_USE_NON_PNFS), EXCHGID4_FLAG_USE_PNFS_MDS);
    v.session(b"pnfs-client", true).await;

    // Create a file in the striped directory; its layout attributes.
    let mut res = v
        .seq(|o| {
            o.putrootfh().lookup("io").open(b"o", "f", OPEN4_SHARE_ACCESS_BOTH, 0, true).getfh();
            o.getattr(&[attrs::FS_LAYOUT_TYPES, attrs::LAYOUT_BLKSIZE]);
        })
        .await;
    res.seq();
    res.ok(OP_PUTROOTFH);
    res.ok(OP_LOOKUP);
    let open = res.open();
    let fh = res.fh();
    res.ok(OP_GETATTR);
    let (types, blksize) = res.with(|r| {
        let (b, l) = attrs::decode_raw(r).unwrap();
        assert!(b.has(attrs::FS_LAYOUT_TYPES) && b.has(attrs::LAYOUT_BLKSIZE));
        let mut l = Reader::new(l);
        assert_eq!(l.u32().unwrap(), 1);
        (l.u32().unwrap(), l.u32().unwrap())
    });
    assert_eq!((types, blksize), (LAYOUT4_NFSV4_1_FILES, UNIT));
    let ino = client.lookup(io, "f").await.unwrap().ino;
    let servers = client.getattr(ino).await.unwrap().layout.unwrap().servers;
    assert_eq!(servers.len(), SERVERS as usize);

    let layoutget = |o: &mut Ops, iomode: u32, sid: &Sid, maxcount: u32| {
        let w = o.op(OP_LAYOUTGET);
        w.bool(false).u32(LAYOUT4_NFSV4_1_FILES).u32(iomode).u64(0).u64(u64::MAX).u64(0);
        w.u32(sid.0).fixed(&sid.1).u32(maxcount);
    };
    // ANY is no iomode to ask for; a maxcount the layout does not fit is TOOSMALL.
    let mut res = v.on_fh(&fh, |o| layoutget(o, IOMODE_ANY, &open, 65536)).await;
    assert_eq!(res.op(OP_LAYOUTGET), NFS4ERR_BADIOMODE);
    let mut res = v.on_fh(&fh, |o| layoutget(o, IOMODE_RW, &open, 64)).await;
    assert_eq!(res.op(OP_LAYOUTGET), NFS4ERR_TOOSMALL);
    let mut res = v.on_fh(&fh, |o| layoutget(o, IOMODE_RW, &open, 65536)).await;
    res.ok(OP_LAYOUTGET);
    let (roc, lsid, device, fhs) = res.with(|r| {
        let roc = r.bool().unwrap();
        let lsid: Sid = (r.u32().unwrap(), r.fixed(12).unwrap().try_into().unwrap());
        assert_eq!(r.u32().unwrap(), 1, "one layout");
        assert_eq!((r.u64().unwrap(), r.u64().unwrap(), r.u32().unwrap()), (0, u64::MAX, IOMODE_RW));
        assert_eq!(r.u32().unwrap(), LAYOUT4_NFSV4_1_FILES);
        let mut b = Reader::new(r.opaque(65536).unwrap());
        let device: DeviceId = b.fixed(16).unwrap().try_into().unwrap();
        let util = b.u32().unwrap();
        assert_eq!((util & NFL4_UFLG_DENSE, util), (0, UNIT), "sparse: file offsets go to the data servers");
        assert_eq!((b.u32().unwrap(), b.u64().unwrap()), (0, 0), "first stripe index, pattern offset");
        let n = b.u32().unwrap();
        let fhs: Vec<Vec<u8>> = (0..n).map(|_| b.opaque(128).unwrap().to_vec()).collect();
        assert_eq!(b.remaining(), 0);
        (roc, lsid, device, fhs)
    });
    assert!(!roc);
    assert_eq!((lsid.0, lsid.1[4]), (1, 3), "a layout stateid, seqid 1");
    assert_eq!(fhs.len(), SERVERS as usize);
    for (i, h) in fhs.iter().enumerate() {
        let d = weft_nfs::ds::fh::decode(h).unwrap();
        assert_eq!((d.cap.ino, d.unit, d.count, d.index), (ino, UNIT, SERVERS, i as u32));
        assert_eq!(d.cap.key_id, "pnfs");
    }

    // The device: stripe index i → server i's NFS addresses, as the MDS lists them.
    let devices = client.pnfs_devices().await.unwrap();
    let mut res = v
        .seq(|o| {
            o.op(OP_GETDEVICEINFO).fixed(&device).u32(LAYOUT4_NFSV4_1_FILES).u32(65536).u32(0);
        })
        .await;
    res.seq();
    res.ok(OP_GETDEVICEINFO);
    res.with(|r| {
        assert_eq!(r.u32().unwrap(), LAYOUT4_NFSV4_1_FILES);
        let mut b = Reader::new(r.opaque(65536).unwrap());
        assert_eq!(r.u32().unwrap(), 0, "no notifications");
        let n = b.u32().unwrap();
        let idx: Vec<u32> = (0..n).map(|_| b.u32().unwrap()).collect();
        assert_eq!(idx, (0..SERVERS).collect::<Vec<_>>());
        assert_eq!(b.u32().unwrap(), SERVERS);
        for id in &servers {
            let want = &devices.iter().find(|d| d.server == *id).unwrap().addrs;
            let k = b.u32().unwrap() as usize;
            assert_eq!(k, want.len());
            for a in want {
                let (netid, uaddr) = netaddr(a);
                assert_eq!(b.opaque(16).unwrap(), netid.as_bytes());
                assert_eq!(b.opaque(64).unwrap(), uaddr.as_bytes());
            }
        }
    });
    // A forged device id; too small a maxcount (the size needed comes back).
    let mut forged = device;
    forged[15] ^= 0x40;
    let mut res = v
        .seq(|o| {
            o.op(OP_GETDEVICEINFO).fixed(&forged).u32(LAYOUT4_NFSV4_1_FILES).u32(65536).u32(0);
        })
        .await;
    res.seq();
    assert_eq!(res.op(OP_GETDEVICEINFO), NFS4ERR_NOENT);
    let mut res = v
        .seq(|o| {
            o.op(OP_GETDEVICEINFO).fixed(&device).u32(LAYOUT4_NFSV4_1_FILES).u32(16).u32(0);
        })
        .await;
    res.seq();
    assert_eq!(res.op(OP_GETDEVICEINFO), NFS4ERR_TOOSMALL);
    assert!(res.with(|r| r.u32().unwrap()) > 16);
    // GETDEVICELIST names it.
    let mut res = v
        .on_fh(&fh, |o| {
            o.op(OP_GETDEVICELIST).u32(LAYOUT4_NFSV4_1_FILES).u32(16).u64(0).fixed(&[0; 8]);
        })
        .await;
    res.ok(OP_GETDEVICELIST);
    res.with(|r| {
        r.fixed(16).unwrap();
        assert_eq!(r.u32().unwrap(), 1);
        assert_eq!(r.fixed(16).unwrap(), &device[..]);
        assert!(r.bool().unwrap(), "eof");
    });

    // LAYOUTCOMMIT: the last write offset + 1 becomes the size at the MDS; a smaller one changes nothing.
    let layoutcommit = |o: &mut Ops, sid: &Sid, last: u64| {
        let w = o.op(OP_LAYOUTCOMMIT);
        w.u64(0).u64(u64::MAX).bool(false).u32(sid.0).fixed(&sid.1);
        w.bool(true).u64(last).bool(true).u64(1_700_000_000).u32(5).u32(LAYOUT4_NFSV4_1_FILES).opaque(b"");
    };
    let mut res = v.on_fh(&fh, |o| layoutcommit(o, &lsid, 300_000)).await;
    res.ok(OP_LAYOUTCOMMIT);
    assert_eq!(res.with(|r| (r.bool().unwrap(), r.u64().unwrap())), (true, 300_001));
    let a = client.getattr(ino).await.unwrap();
    assert_eq!(a.size, 300_001);
    assert!(a.mtime_ns >= 1_700_000_000_000_000_005);
    let mut res = v.on_fh(&fh, |o| layoutcommit(o, &lsid, 10)).await;
    res.ok(OP_LAYOUTCOMMIT);
    assert!(!res.with(|r| r.bool().unwrap()), "the size did not change");
    assert_eq!(client.getattr(ino).await.unwrap().size, 300_001);

    // An ec file has no file layout: served through the gateway.
    let mut res = v
        .seq(|o| {
            o.putrootfh().lookup("ec").open(b"o", "e", OPEN4_SHARE_ACCESS_BOTH, 0, true);
            layoutget(o, IOMODE_RW, &(1, [0; 12]), 65536);
        })
        .await;
    res.seq();
    res.ok(OP_PUTROOTFH);
    res.ok(OP_LOOKUP);
    res.open();
    assert_eq!(res.op(OP_LAYOUTGET), NFS4ERR_LAYOUTUNAVAILABLE);

    // LAYOUTRETURN of the whole file: the layout is gone, its stateid with it.
    let mut res = v
        .on_fh(&fh, |o| {
            let w = o.op(OP_LAYOUTRETURN);
            w.bool(false).u32(LAYOUT4_NFSV4_1_FILES).u32(IOMODE_ANY).u32(LAYOUTRETURN4_FILE);
            w.u64(0).u64(u64::MAX).u32(lsid.0).fixed(&lsid.1).opaque(b"");
        })
        .await;
    res.ok(OP_LAYOUTRETURN);
    assert!(!res.with(|r| r.bool().unwrap()), "nothing left");
    let mut res = v.on_fh(&fh, |o| layoutcommit(o, &lsid, 400_000)).await;
    assert_eq!(res.op(OP_LAYOUTCOMMIT), NFS4ERR_BAD_STATEID);
    assert_eq!(client.getattr(ino).await.unwrap().size, 300_001);
}

/// An UNSTABLE WRITE's verifier and a COMMIT's, as the client reads them.
async fn write_unstable(v: &mut V4, fh: &[u8], sid: &Sid, data: &[u8]) -> [u8; 8] {
    let mut res = v
        .on_fh(fh, |o| {
            o.write(sid, 0, 0, data);
        })
        .await;
    res.ok(OP_WRITE);
    res.with(|r| {
        assert_eq!((r.u32().unwrap() as usize, r.u32().unwrap()), (data.len(), 0));
        r.fixed(8).unwrap().try_into().unwrap()
    })
}

async fn commit_verifier(v: &mut V4, fh: &[u8]) -> [u8; 8] {
    let mut res = v
        .on_fh(fh, |o| {
            o.commit();
        })
        .await;
    res.ok(OP_COMMIT);
    res.with(|r| r.fixed(8).unwrap().try_into().unwrap())
}

/// Lost unsynced writes through the gateway (docs/format.md §33): the data server under a file reboots between
/// an UNSTABLE WRITE and its COMMIT and comes back without it. The COMMIT answers another verifier than the
/// WRITE's, so the NFS client resends what it has not seen committed (RFC 8881 §18.32.3), and the resent bytes are
/// what every reader then gets. Before write verifiers reached the data servers the COMMIT answered the WRITE's
/// verifier: the client dropped its pages, and the write was gone.
#[tokio::test(flavor = "multi_thread")]
async fn v41_a_data_servers_reboot_makes_the_commit_verifier_change_and_the_resend_lands() {
    let mut c = common::start("nfs4-reboot", 1).await;
    io_dir(&c).await;
    let g = gateway(&c).await;
    let mut a = V4::connect(g.addr()).await;
    a.session(b"client-reboot", true).await;
    let (sid, fh) = a.open_in_io(b"owner-r", "data", OPEN4_SHARE_ACCESS_BOTH, true).await;
    let (first, second) = (pattern(70_000, 81), pattern(70_000, 82));
    let v1 = write_unstable(&mut a, &fh, &sid, &first).await;
    assert_eq!(commit_verifier(&mut a, &fh).await, v1, "nothing lost: the verifier holds");
    let durable = c.dir().join("durable-root");
    common::copy_tree(&c.data_root(0), &durable);

    assert_eq!(write_unstable(&mut a, &fh, &sid, &second).await, v1);
    common::power_loss(&mut c, 0, &durable, "nfs-reboot").await;
    let v2 = commit_verifier(&mut a, &fh).await;
    assert_ne!(v2, v1, "the COMMIT tells the client its unstable WRITE may be lost");
    assert_eq!(write_unstable(&mut a, &fh, &sid, &second).await, v2, "the resend");
    assert_eq!(commit_verifier(&mut a, &fh).await, v2);
    let mut res = a
        .on_fh(&fh, |o| {
            o.close(&sid);
        })
        .await;
    res.ok(OP_CLOSE);

    let client = c.client().await;
    let f = client.open("/io/data", weft_client::OpenMode::Read).await.unwrap();
    let got = f.read_at(0, bytes::BytesMut::zeroed(second.len())).await.unwrap();
    assert!(got[..] == second[..], "the resent bytes are the file's");
}

/// SEQUENCE's `sr_status_flags` of a compound of SEQUENCE alone.
async fn seq_flags(v: &mut V4) -> u32 {
    let mut res = v.seq(|_| {}).await;
    res.ok(OP_SEQUENCE);
    res.with(|r| {
        r.fixed(16 + 16).unwrap();
        r.u32().unwrap()
    })
}

/// Reads the next record on the client's connection: it must be a CB_COMPOUND of CB_SEQUENCE and
/// CB_LAYOUTRECALL; returns its xid, CB_SEQUENCE's (session, sequence id) and the recall's (fh, stateid).
async fn cb_layoutrecall(v: &mut V4) -> (u32, [u8; 16], u32, Vec<u8>, Sid) {
    use weft_nfs::nfs4::callback::*;
    let rec = rpc::read_record(&mut v.s, &RecordLimits::default()).await.unwrap().expect("a callback");
    let call = rpc::parse_call(&rec).expect("a call, not a reply");
    assert_eq!((call.prog, call.vers, call.proc_), (0x4000_0000, 1, 1), "CB_COMPOUND of cb_program");
    assert!(matches!(call.auth, rpc::Auth::Sys { uid: 0, gid: 0, .. }), "the AUTH_SYS the client offered");
    let mut r = Reader::new(call.args);
    r.opaque(1024).unwrap();
    assert_eq!((r.u32().unwrap(), r.u32().unwrap(), r.u32().unwrap()), (1, 0, 2));
    assert_eq!(r.u32().unwrap(), OP_CB_SEQUENCE);
    let sid: [u8; 16] = r.fixed(16).unwrap().try_into().unwrap();
    let seqid = r.u32().unwrap();
    assert_eq!((r.u32().unwrap(), r.u32().unwrap(), r.bool().unwrap(), r.u32().unwrap()), (0, 0, false, 0));
    assert_eq!(r.u32().unwrap(), OP_CB_LAYOUTRECALL);
    assert_eq!((r.u32().unwrap(), r.u32().unwrap(), r.bool().unwrap()), (1, 3, true), "FILES, ANY, changed");
    assert_eq!(r.u32().unwrap(), LAYOUTRECALL4_FILE);
    let fh = r.opaque(128).unwrap().to_vec();
    assert_eq!((r.u64().unwrap(), r.u64().unwrap()), (0, u64::MAX));
    let lsid: Sid = (r.u32().unwrap(), r.fixed(12).unwrap().try_into().unwrap());
    (call.xid, sid, seqid, fh, lsid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn v41_pnfs_layouts_are_recalled_over_the_back_channel() {
    use weft_nfs::nfs4::callback::*;
    use weft_nfs::nfs4::layout::*;
    let c = common::start_with("nfs4-recall", 2, |o| o.ds_nfs = true).await;
    let client = c.client().await;
    let io = io_dir(&c).await;
    client.set_layout(io, 65536, 2).await.unwrap();
    let o = NfsOptions {
        extra_args: ["--nfs4-grace-ms", "0", "--pnfs", "on", "--nfs4-recall-ms", "1000", "--layout-check-ms", "50"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        ..NfsOptions::default()
    };
    let g = c.start_nfs(&o).await.unwrap();
    let mut v = V4::connect(g.addr()).await;
    v.cs_flags = CREATE_SESSION4_FLAG_CONN_BACK_CHAN;
    v.session(b"recall-client", true).await;
    assert_eq!(v.cs_flags, CREATE_SESSION4_FLAG_CONN_BACK_CHAN, "this connection is the back channel");
    let (open, fh) = v.open_in_io(b"o", "f", OPEN4_SHARE_ACCESS_BOTH, true).await;
    let ino = client.lookup(io, "f").await.unwrap().ino;
    let size = |n| weft_proto::SetAttrs { size: Some(n), ..Default::default() };
    client.setattr(ino, size(100_000)).await.unwrap();
    let layoutget = |o: &mut Ops, sid: &Sid| {
        let w = o.op(OP_LAYOUTGET);
        w.bool(false).u32(LAYOUT4_NFSV4_1_FILES).u32(IOMODE_RW).u64(0).u64(u64::MAX).u64(0);
        w.u32(sid.0).fixed(&sid.1).u32(65536);
    };
    let get = |res: &mut Res| {
        res.ok(OP_LAYOUTGET);
        res.with(|r| {
            r.bool().unwrap();
            (r.u32().unwrap(), <[u8; 12]>::try_from(r.fixed(12).unwrap()).unwrap())
        })
    };
    let mut res = v.on_fh(&fh, |o| layoutget(o, &open)).await;
    let lsid = get(&mut res);

    // A truncate made elsewhere (the native client): the periodic check recalls the layout on this connection,
    // with CB_SEQUENCE slot 0 sequence 1 and the layout stateid one seqid on.
    client.setattr(ino, size(10)).await.unwrap();
    let (xid, sid, seqid, rfh, rsid) = cb_layoutrecall(&mut v).await;
    assert_eq!((sid, seqid, &rfh), (v.sid, 1, &fh));
    assert_eq!(rsid, (lsid.0 + 1, lsid.1));
    // Until the client returns it, a LAYOUTGET of the file conflicts with the recall.
    let mut res = v.on_fh(&fh, |o| layoutget(o, &rsid)).await;
    assert_eq!(res.op(OP_LAYOUTGET), NFS4ERR_RECALLCONFLICT);
    // Answered OK, then returned with the recall's stateid: a new layout may be had.
    let mut w = rpc::accepted(xid, rpc::SUCCESS);
    w.u32(NFS4_OK).opaque(b"").u32(2);
    w.u32(OP_CB_SEQUENCE).u32(NFS4_OK).fixed(&v.sid).u32(1).u32(0).u32(0).u32(0);
    w.u32(OP_CB_LAYOUTRECALL).u32(NFS4_OK);
    v.s.write_all(&rpc::encode_record(&w.buf)).await.unwrap();
    let mut res = v
        .on_fh(&fh, |o| {
            let w = o.op(OP_LAYOUTRETURN);
            w.bool(false).u32(LAYOUT4_NFSV4_1_FILES).u32(IOMODE_ANY).u32(1).u64(0).u64(u64::MAX);
            w.u32(rsid.0).fixed(&rsid.1).opaque(b"");
        })
        .await;
    res.ok(OP_LAYOUTRETURN);
    assert!(!res.with(|r| r.bool().unwrap()), "returned whole: the stateid is forgotten");
    assert_eq!(seq_flags(&mut v).await, 0, "the back channel is up");
    let mut res = v.on_fh(&fh, |o| layoutget(o, &open)).await;
    let lsid2 = get(&mut res);
    assert_ne!(lsid2.1, lsid.1);

    // A chmod through the gateway recalls at once (CB sequence 2); this time the client never answers: the
    // layout is revoked and SEQUENCE reports the back channel down until a BIND_CONN_TO_SESSION.
    let args = v.seq_args(|o| {
        o.putfh(&fh);
        let w = o.op(OP_SETATTR);
        w.u32(0).fixed(&[0; 12]);
        let mut l = Writer::new();
        l.u32(0o600);
        Bitmap::of(&[attrs::MODE]).encode(w);
        w.opaque(&l.buf);
    });
    v.xid += 1;
    let mut w = rpc::encode_call(v.xid, NFS_PROGRAM, 4, 1, Some((UID, UID, &[])));
    w.buf.extend_from_slice(&args);
    v.s.write_all(&rpc::encode_record(&w.buf)).await.unwrap();
    // The callback and SETATTR's reply share the connection; either may come first.
    let mut recalled = None;
    let mut replied = false;
    while recalled.is_none() || !replied {
        let rec = rpc::read_record(&mut v.s, &RecordLimits::default()).await.unwrap().unwrap();
        match rpc::parse_reply(&rec) {
            Ok(ReplyHead::Accepted { xid, stat, rest }) => {
                assert_eq!((xid, stat), (v.xid, rpc::SUCCESS));
                assert_eq!(Reader::new(rest).u32().unwrap(), NFS4_OK, "SETATTR's compound");
                replied = true;
            }
            Ok(other) => panic!("{other:?}"),
            Err(_) => {
                let call = rpc::parse_call(&rec).unwrap();
                let mut r = Reader::new(call.args);
                r.opaque(1024).unwrap();
                r.fixed(16).unwrap();
                assert_eq!(r.fixed(16).unwrap(), &v.sid[..]);
                recalled = Some(r.u32().unwrap());
            }
        }
    }
    assert_eq!(recalled, Some(2), "the back channel's slot sequence moved on after the answered callback");
    let mut flags = 0;
    for _ in 0..400 {
        flags = seq_flags(&mut v).await;
        if flags != 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(flags, SEQ4_STATUS_CB_PATH_DOWN_SESSION | SEQ4_STATUS_CB_PATH_DOWN, "unanswered: path down");
    let mut res = v
        .on_fh(&fh, |o| {
            let w = o.op(OP_LAYOUTCOMMIT);
            w.u64(0).u64(u64::MAX).bool(false).u32(lsid2.0 + 1).fixed(&lsid2.1);
            w.bool(false).bool(false).u32(LAYOUT4_NFSV4_1_FILES).opaque(b"");
        })
        .await;
    assert_eq!(res.op(OP_LAYOUTCOMMIT), NFS4ERR_BAD_STATEID, "the unanswered recall's layout was revoked");
    // Rebinding this connection for the back channel brings it back.
    let mut ops = Ops::default();
    ops.op(OP_BIND_CONN_TO_SESSION).fixed(&v.sid).u32(CDFC4_BACK_OR_BOTH).bool(false);
    let mut res = v.send(&V4::args(1, &ops)).await;
    res.ok(OP_BIND_CONN_TO_SESSION);
    assert_eq!(res.with(|r| (r.fixed(16).unwrap().to_vec(), r.u32().unwrap())), (v.sid.to_vec(), CDFS4_BOTH));
    assert_eq!(seq_flags(&mut v).await, 0, "the back channel is up again");
}

/// NFSv4.1 state belongs to its principal (issue 31; RFC 8881 §2.4, §18.35.5). Another uid presenting a live
/// client's owner string with a new verifier (what a rebooted client sends) gets NFS4ERR_CLID_INUSE instead of
/// dropping that client's state and locks; it cannot destroy the client's session, bind a connection to it (and
/// so take its callbacks), or destroy the client; the client's session and lock live on. Client ids do not step
/// by one: the next client's id says nothing about another's.
#[tokio::test(flavor = "multi_thread")]
async fn v41_state_is_bound_to_its_principal() {
    let c = common::start("nfs4-principal", 1).await;
    io_dir(&c).await;
    let g = gateway(&c).await;
    let mut victim = V4::connect(g.addr()).await;
    victim.session(b"victim", true).await;
    let (open, fh) = victim.open_in_io(b"vo", "locked", OPEN4_SHARE_ACCESS_BOTH, true).await;
    let mut res = victim
        .on_fh(&fh, |o| {
            o.lock_new(WRITE_LT, 0, 100, &open, b"vl");
        })
        .await;
    res.ok(OP_LOCK);

    let mut mallory = V4::connect(g.addr()).await;
    mallory.uid = UID + 1;
    let mut ops = Ops::default();
    ops.op(OP_EXCHANGE_ID).fixed(&[8; 8]).opaque(b"victim").u32(0).u32(0).u32(0);
    assert_eq!(mallory.send(&V4::args(1, &ops)).await.status, NFS4ERR_CLID_INUSE, "the owner string is taken");
    let mut ops = Ops::default();
    ops.op(OP_DESTROY_SESSION).fixed(&victim.sid);
    assert_eq!(mallory.send(&V4::args(1, &ops)).await.status, NFS4ERR_WRONG_CRED, "DESTROY_SESSION");
    let mut ops = Ops::default();
    ops.op(OP_BIND_CONN_TO_SESSION).fixed(&victim.sid).u32(2).bool(false);
    assert_eq!(mallory.send(&V4::args(1, &ops)).await.status, NFS4ERR_WRONG_CRED, "BIND_CONN_TO_SESSION");
    let mut ops = Ops::default();
    ops.op(OP_DESTROY_CLIENTID).u64(victim.clientid);
    assert_eq!(mallory.send(&V4::args(1, &ops)).await.status, NFS4ERR_WRONG_CRED, "DESTROY_CLIENTID");

    // The victim's session and lock live on: its SEQUENCE works, and another client's LOCK inside it is DENIED.
    let mut res = victim.seq(|_| {}).await;
    res.seq();
    mallory.session(b"mallory", true).await;
    assert_ne!(mallory.clientid as u32, (victim.clientid as u32).wrapping_add(1), "ids step by one");
    let (theirs, _) = mallory.open_in_io(b"mo", "locked", OPEN4_SHARE_ACCESS_READ, false).await;
    let mut res = mallory
        .on_fh(&fh, |o| {
            o.lock_new(READ_LT, 50, 10, &theirs, b"ml");
        })
        .await;
    assert_eq!(res.op(OP_LOCK), NFS4ERR_DENIED, "the victim's lock is still held");
}

/// One host cannot fill the gateway's client table with made-up owner strings (issue 31): 8 clients from one
/// address (`--nfs4-clients-per-address 8`; 64 by default) and the 9th owner is NFS4ERR_RESOURCE, while a client
/// from another address (127.0.0.2) still makes a session and opens a file, and a client of the flooding address
/// that exists already renews.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v41_one_address_cannot_fill_the_client_table() {
    let c = common::start("nfs4-flood", 1).await;
    io_dir(&c).await;
    let args = ["--nfs4-grace-ms", "0", "--nfs4-clients-per-address", "8"].map(String::from).to_vec();
    let o = NfsOptions { extra_args: args, ..NfsOptions::default() };
    let g = c.start_nfs(&o).await.unwrap_or_else(|e| panic!("starting the gateway: {e}"));
    let mut flood = V4::connect(g.addr()).await;
    let exchange = |owner: String| {
        let mut ops = Ops::default();
        ops.op(OP_EXCHANGE_ID).fixed(&[3; 8]).opaque(owner.as_bytes()).u32(0).u32(0).u32(0);
        V4::args(1, &ops)
    };
    for i in 0..8 {
        assert_eq!(flood.send(&exchange(format!("flood-{i}"))).await.status, NFS4_OK, "owner {i}");
    }
    assert_eq!(flood.send(&exchange("flood-8".into())).await.status, NFS4ERR_RESOURCE, "the 9th owner");
    assert_eq!(flood.send(&exchange("flood-0".into())).await.status, NFS4_OK, "a known client renews");

    let mut other = V4::connect_from(g.addr(), std::net::Ipv4Addr::new(127, 0, 0, 2)).await;
    other.session(b"another host", true).await;
    other.open_in_io(b"oo", "from-another-host", OPEN4_SHARE_ACCESS_BOTH, true).await;
}

/// EXCHANGE_ID alone (verifier `[verf; 8]`, `flags`): its status and (clientid, sequence id, flags answered).
async fn exchange(v: &mut V4, owner: &[u8], verf: u8, flags: u32) -> (u32, Option<(u64, u32, u32)>) {
    let mut ops = Ops::default();
    ops.op(OP_EXCHANGE_ID).fixed(&[verf; 8]).opaque(owner).u32(flags).u32(0).u32(0);
    let mut res = v.send(&V4::args(1, &ops)).await;
    let st = res.op(OP_EXCHANGE_ID);
    (st, (st == NFS4_OK).then(|| res.with(|r| (r.u64().unwrap(), r.u32().unwrap(), r.u32().unwrap()))))
}

/// A channel's attributes as CREATE_SESSION sends them: request, reply, cached reply sizes, ops, slots.
type Chan = [u32; 5];
const FORE: Chan = [1 << 20, 1 << 20, 8192, 16, 8];
const BACK: Chan = [4096, 4096, 0, 2, 1];

/// CREATE_SESSION alone: its status and the session id.
async fn create_session(v: &mut V4, clientid: u64, seq: u32, flags: u32, fore: Chan, back: Chan) -> (u32, [u8; 16]) {
    let mut ops = Ops::default();
    let w = ops.op(OP_CREATE_SESSION);
    w.u64(clientid).u32(seq).u32(flags);
    for c in [fore, back] {
        w.u32(0).u32(c[0]).u32(c[1]).u32(c[2]).u32(c[3]).u32(c[4]).u32(0);
    }
    w.u32(0x4000_0000).u32(1).u32(0); // the callback program, AUTH_NONE
    let mut res = v.send(&V4::args(1, &ops)).await;
    let st = res.op(OP_CREATE_SESSION);
    (st, if st == NFS4_OK { res.with(|r| r.fixed(16).unwrap().try_into().unwrap()) } else { [0; 16] })
}

/// The status of one op after SEQUENCE (`cache_this` as given), the rest of the compound built by `f`; the
/// compound's status when SEQUENCE itself failed.
async fn after_seq(v: &mut V4, cache_this: bool, f: impl FnOnce(&mut Ops)) -> Vec<u32> {
    v.seqid += 1;
    let mut ops = Ops::default();
    ops.op(OP_SEQUENCE).fixed(&v.sid).u32(v.seqid).u32(0).u32(0).bool(cache_this);
    f(&mut ops);
    let args = V4::args(1, &ops);
    let res = v.send(&args).await;
    // Every result's status, in order, read from the reply as far as the first failure (bodies skipped by the
    // caller's knowledge is not needed: only the last status can be an error).
    let mut r = Reader::new(&res.buf);
    r.fixed(res.pos).unwrap();
    let mut out = vec![res.status];
    if r.u32().unwrap() == OP_SEQUENCE {
        out.push(r.u32().unwrap());
    }
    out
}

/// RFC 8881's client and session ops case by case (issue 30 item 5), on a real gateway: EXCHANGE_ID's §18.35.5
/// cases and flags, CREATE_SESSION's replay, bad flags and channels too small (§18.36), a reply too big to cache
/// (§18.46.3), RECLAIM_COMPLETE before and after opens (§18.51), DESTROY_CLIENTID with sessions or state alive and
/// of an unknown client (§18.50), a restarted client's earlier state dropped only once it is confirmed.
#[tokio::test(flavor = "multi_thread")]
async fn v41_client_and_session_ops_as_rfc_8881_says() {
    let c = common::start("nfs4-rfc", 2).await;
    io_dir(&c).await;
    let g = gateway(&c).await;
    let mut v = V4::connect(g.addr()).await;
    const UPD: u32 = EXCHGID4_FLAG_UPD_CONFIRMED_REC_A;
    // A client may not send CONFIRMED_R, nor bits RFC 8881 does not define.
    assert_eq!(exchange(&mut v, b"rfc", 1, EXCHGID4_FLAG_CONFIRMED_R).await.0, NFS4ERR_INVAL);
    assert_eq!(exchange(&mut v, b"rfc", 1, 0x0800_0000).await.0, NFS4ERR_INVAL);
    // Case 7: an update of no record. Case 1, then case 4: an unconfirmed record replaced by a new client.
    assert_eq!(exchange(&mut v, b"rfc", 1, UPD).await.0, NFS4ERR_NOENT);
    let (_, Some((first, seq, flags))) = exchange(&mut v, b"rfc", 1, 0).await else { panic!("case 1") };
    assert_eq!((seq, flags & EXCHGID4_FLAG_CONFIRMED_R), (1, 0));
    assert_eq!(exchange(&mut v, b"rfc", 1, UPD).await.0, NFS4ERR_NOENT, "an unconfirmed record is not updated");
    let (_, Some((clientid, seq, _))) = exchange(&mut v, b"rfc", 1, 0).await else { panic!("case 4") };
    assert_ne!(clientid, first);
    assert_eq!(create_session(&mut v, first, 1, 0, FORE, BACK).await.0, NFS4ERR_STALE_CLIENTID);
    // CREATE_SESSION: bad flags, channels too small, then a session and its replay.
    assert_eq!(create_session(&mut v, clientid, seq, 0x10, FORE, BACK).await.0, NFS4ERR_INVAL);
    for (fore, back) in
        [([100, 1 << 20, 0, 8, 8], BACK), ([1 << 20, 100, 0, 8, 8], BACK), (FORE, [4096, 4096, 0, 1, 1])]
    {
        assert_eq!(create_session(&mut v, clientid, seq, 0, fore, back).await.0, NFS4ERR_TOOSMALL, "{fore:?} {back:?}");
    }
    let (st, sid) = create_session(&mut v, clientid, seq, 0, FORE, BACK).await;
    assert_eq!(st, NFS4_OK);
    assert_eq!(create_session(&mut v, clientid, seq, 0, FORE, BACK).await, (NFS4_OK, sid), "a replay");
    assert_eq!(create_session(&mut v, clientid, seq + 2, 0, FORE, BACK).await.0, NFS4ERR_SEQ_MISORDERED);
    (v.sid, v.seqid, v.clientid) = (sid, 0, clientid);
    // Cases 2 and 6: the confirmed client; 8: an update with another verifier; 9 and 3: another principal.
    let (_, Some((same, _, flags))) = exchange(&mut v, b"rfc", 1, 0).await else { panic!("case 2") };
    assert_eq!((same, flags & EXCHGID4_FLAG_CONFIRMED_R), (clientid, EXCHGID4_FLAG_CONFIRMED_R));
    assert_eq!(exchange(&mut v, b"rfc", 1, UPD).await.1.map(|x| x.0), Some(clientid), "case 6");
    assert_eq!(exchange(&mut v, b"rfc", 2, UPD).await.0, NFS4ERR_NOT_SAME);
    v.uid = UID + 1;
    assert_eq!(exchange(&mut v, b"rfc", 1, UPD).await.0, NFS4ERR_PERM);
    assert_eq!(exchange(&mut v, b"rfc", 1, 0).await.0, NFS4ERR_CLID_INUSE);
    v.uid = UID;

    // RECLAIM_COMPLETE: for one file system it needs a current filehandle; before it, no new open (GRACE, even
    // with the grace period over); after it, opens; a second one is COMPLETE_ALREADY.
    assert_eq!(
        after_seq(&mut v, false, |o| {
            o.op(OP_RECLAIM_COMPLETE).bool(true);
        })
        .await[0],
        NFS4ERR_NOFILEHANDLE
    );
    let mut res = v
        .seq(|o| {
            o.putrootfh().lookup("io").open(b"o", "f", OPEN4_SHARE_ACCESS_BOTH, 0, true);
        })
        .await;
    res.seq();
    res.ok(OP_PUTROOTFH);
    res.ok(OP_LOOKUP);
    assert_eq!(res.op(OP_OPEN), NFS4ERR_GRACE);
    assert_eq!(
        after_seq(&mut v, false, |o| {
            o.putrootfh().op(OP_RECLAIM_COMPLETE).bool(true);
        })
        .await[0],
        NFS4_OK
    );
    assert_eq!(
        after_seq(&mut v, false, |o| {
            o.op(OP_RECLAIM_COMPLETE).bool(false);
        })
        .await[0],
        NFS4_OK
    );
    assert_eq!(
        after_seq(&mut v, false, |o| {
            o.op(OP_RECLAIM_COMPLETE).bool(false);
        })
        .await[0],
        NFS4ERR_COMPLETE_ALREADY
    );
    let (open, _) = v.open_in_io(b"o", "f", OPEN4_SHARE_ACCESS_BOTH, true).await;

    // DESTROY_CLIENTID: of an unknown client, STALE_CLIENTID; of one with a session (it may follow a SEQUENCE),
    // CLIENTID_BUSY. EXCHANGE_ID may follow a SEQUENCE too.
    let mut ops = Ops::default();
    ops.op(OP_DESTROY_CLIENTID).u64(clientid ^ 0xffff);
    assert_eq!(v.send(&V4::args(1, &ops)).await.op(OP_DESTROY_CLIENTID), NFS4ERR_STALE_CLIENTID);
    assert_eq!(
        after_seq(&mut v, false, |o| {
            o.op(OP_DESTROY_CLIENTID).u64(clientid);
        })
        .await[0],
        NFS4ERR_CLIENTID_BUSY
    );
    let st = after_seq(&mut v, false, |o| {
        o.op(OP_EXCHANGE_ID).fixed(&[1; 8]).opaque(b"rfc").u32(0).u32(0).u32(0);
    });
    assert_eq!(st.await[0], NFS4_OK);

    // Case 5: the client restarts (a new verifier). Its earlier session and open live on until the new client
    // is confirmed by its first session, then they are gone.
    let (_, Some((restarted, seq, _))) = exchange(&mut v, b"rfc", 2, 0).await else { panic!("case 5") };
    assert_ne!(restarted, clientid);
    let mut res = v
        .seq(|o| {
            o.putrootfh().lookup("io").lookup("f").read(&open, 0, 1);
        })
        .await;
    res.seq();
    let (st, new_sid) = create_session(&mut v, restarted, seq, 0, FORE, BACK).await;
    assert_eq!(st, NFS4_OK);
    assert_eq!(after_seq(&mut v, false, |_| ()).await, vec![NFS4ERR_BADSESSION, NFS4ERR_BADSESSION]);
    (v.sid, v.seqid, v.clientid) = (new_sid, 0, restarted);
    // Without sessions or state, the client can be destroyed (once).
    let mut ops = Ops::default();
    ops.op(OP_DESTROY_SESSION).fixed(&new_sid);
    assert_eq!(v.send(&V4::args(1, &ops)).await.op(OP_DESTROY_SESSION), NFS4_OK);
    for want in [NFS4_OK, NFS4ERR_STALE_CLIENTID] {
        let mut ops = Ops::default();
        ops.op(OP_DESTROY_CLIENTID).u64(restarted);
        assert_eq!(v.send(&V4::args(1, &ops)).await.op(OP_DESTROY_CLIENTID), want);
    }

    // A session caching replies of at most 160 bytes: a compound asking for its reply to be cached whose reply
    // is larger is REP_TOO_BIG_TO_CACHE at the op that passes it; the same compound not cached is served.
    let mut small = V4::connect(g.addr()).await;
    let (_, Some((cid, seq, _))) = exchange(&mut small, b"small-cache", 1, 0).await else { panic!("exchange") };
    let (st, sid) = create_session(&mut small, cid, seq, 0, [1 << 20, 1 << 20, 160, 16, 8], BACK).await;
    assert_eq!(st, NFS4_OK);
    small.sid = sid;
    let big = [attrs::SUPPORTED_ATTRS, attrs::FILEHANDLE, attrs::OWNER, attrs::OWNER_GROUP, attrs::TIME_MODIFY];
    let ask = |o: &mut Ops| {
        o.putrootfh().getattr(&big);
    };
    assert_eq!(after_seq(&mut small, true, ask).await[0], NFS4ERR_REP_TOO_BIG_TO_CACHE);
    assert_eq!(
        after_seq(&mut small, true, |o| {
            o.putrootfh().getattr(&[attrs::TYPE]);
        })
        .await[0],
        NFS4_OK
    );
    assert_eq!(after_seq(&mut small, false, ask).await[0], NFS4_OK);
}

/// GETATTR of `bits` on `fh`: the answer's bitmap and raw attribute list.
async fn raw_attrs(v: &mut V4, fh: &[u8], bits: &[u32]) -> (Bitmap, Vec<u8>) {
    let mut res = v
        .on_fh(fh, |o| {
            o.getattr(bits);
        })
        .await;
    res.ok(OP_GETATTR);
    res.with(|r| {
        let (b, l) = attrs::decode_raw(r).unwrap();
        (b, l.to_vec())
    })
}

/// VERIFY (or NVERIFY) of `bits` with values `list` on `fh`: its status.
async fn verify(v: &mut V4, fh: &[u8], negated: bool, bits: &Bitmap, list: &[u8]) -> u32 {
    let mut res = v
        .on_fh(fh, |o| {
            let w = o.op(if negated { OP_NVERIFY } else { OP_VERIFY });
            bits.encode(w);
            w.opaque(list);
        })
        .await;
    res.op(if negated { OP_NVERIFY } else { OP_VERIFY })
}

/// The statuses of a compound SEQUENCE, then `f`'s ops, as far as the first failure (op bodies skipped by
/// `skip`, the body size of each successful op but the last, in order).
async fn statuses(v: &mut V4, f: impl FnOnce(&mut Ops), codes: &[(u32, usize)]) -> Vec<u32> {
    let mut res = v.seq(f).await;
    res.seq();
    let mut out = Vec::new();
    for &(code, skip) in codes {
        let st = res.op(code);
        out.push(st);
        if st != NFS4_OK {
            break;
        }
        res.with(|r| {
            r.fixed(skip).unwrap();
        });
    }
    out
}

/// RFC 8881 on objects (issue 30 item 5): PUTFH, LOOKUP, LOOKUPP and RENAME on character and block device nodes
/// and a symbolic link (NOTDIR; SYMLINK for LOOKUP through a link); VERIFY and NVERIFY of every mandatory
/// attribute of a file, a directory and a device, with changed values, write-only attributes, `rdattr_error` and
/// one the gateway does not answer; SECINFO and SECINFO_NO_NAME (both styles, the root's parent, a consumed
/// filehandle).
#[tokio::test(flavor = "multi_thread")]
async fn v41_devices_verify_and_secinfo_as_rfc_8881_says() {
    let c = common::start("nfs4-objects", 2).await;
    io_dir(&c).await;
    let o = NfsOptions {
        root_squash: false,
        extra_args: vec!["--nfs4-grace-ms".into(), "0".into()],
        ..NfsOptions::default()
    };
    let g = c.start_nfs(&o).await.unwrap_or_else(|e| panic!("starting the gateway: {e}"));
    let mut v = V4::connect(g.addr()).await;
    v.uid = 0; // device nodes are root's to make
    v.session(b"objects", true).await;
    let io = v.path_fh(&["io"]).await;
    let mut made = Vec::new();
    for (name, ty) in [("cdev", NF4CHR), ("bdev", NF4BLK)] {
        let mut res = v
            .on_fh(&io, |o| {
                let w = o.op(OP_CREATE);
                w.u32(ty).u32(1).u32(3).opaque(name.as_bytes());
                Bitmap::default().encode(w);
                w.opaque(b"");
                o.getfh();
            })
            .await;
        res.ok(OP_CREATE);
        res.with(|r| {
            r.fixed(4 + 16).unwrap();
            Bitmap::decode(r).unwrap();
        });
        made.push((name, ty, res.fh()));
    }
    let mut res = v
        .on_fh(&io, |o| {
            o.op(OP_CREATE).u32(NF4LNK).opaque(b"cdev").opaque(b"link");
            Bitmap::default().encode(&mut o.w);
            o.w.opaque(b"");
        })
        .await;
    res.ok(OP_CREATE);
    let link = v.path_fh(&["io", "link"]).await;

    for (name, ty, fh) in &made {
        // PUTFH of a device is served and GETATTR names its type; it is no directory to look in, up from, or
        // rename from or into.
        let mut res = v
            .on_fh(fh, |o| {
                o.getattr(&[attrs::TYPE]);
            })
            .await;
        assert_eq!(res.attrs(), vec![(attrs::TYPE, *ty as u64)], "{name}");
        let mut res = v
            .on_fh(fh, |o| {
                o.op(OP_LOOKUPP);
            })
            .await;
        assert_eq!(res.op(OP_LOOKUPP), NFS4ERR_NOTDIR, "LOOKUPP of {name}");
        let mut res = v
            .on_fh(fh, |o| {
                o.lookup("x");
            })
            .await;
        assert_eq!(res.op(OP_LOOKUP), NFS4ERR_NOTDIR, "LOOKUP in {name}");
        let mut res = v
            .on_fh(fh, |o| {
                o.savefh().putfh(&io).rename("link", "moved");
            })
            .await;
        res.ok(OP_SAVEFH);
        res.ok(OP_PUTFH);
        assert_eq!(res.op(OP_RENAME), NFS4ERR_NOTDIR, "RENAME from {name}");
        let mut res = v
            .on_fh(&io, |o| {
                o.savefh().putfh(fh).rename("link", "moved");
            })
            .await;
        res.ok(OP_SAVEFH);
        res.ok(OP_PUTFH);
        assert_eq!(res.op(OP_RENAME), NFS4ERR_NOTDIR, "RENAME into {name}");
    }
    let mut res = v
        .on_fh(&link, |o| {
            o.lookup("x");
        })
        .await;
    assert_eq!(res.op(OP_LOOKUP), NFS4ERR_SYMLINK, "LOOKUP through a symbolic link");
    let mut res = v
        .on_fh(&link, |o| {
            o.op(OP_LOOKUPP);
        })
        .await;
    assert_eq!(res.op(OP_LOOKUPP), NFS4ERR_NOTDIR, "LOOKUPP of a symbolic link");

    // VERIFY of each mandatory attribute (rdattr_error aside) with the values GETATTR gave is OK, NVERIFY of
    // them SAME; with one value changed the other way round.
    let (w, _) = v.open_in_io(b"o", "file", OPEN4_SHARE_ACCESS_BOTH, true).await;
    let mut res = v
        .seq(|o| {
            o.putrootfh().lookup("io").lookup("file").write(&w, 0, 2, b"abc");
        })
        .await;
    res.seq();
    let file = v.path_fh(&["io", "file"]).await;
    let mandatory = [
        attrs::SUPPORTED_ATTRS,
        attrs::TYPE,
        attrs::FH_EXPIRE_TYPE,
        attrs::CHANGE,
        attrs::SIZE,
        attrs::LINK_SUPPORT,
        attrs::SYMLINK_SUPPORT,
        attrs::NAMED_ATTR,
        attrs::FSID,
        attrs::UNIQUE_HANDLES,
        attrs::LEASE_TIME,
        attrs::FILEHANDLE,
    ];
    for (what, fh) in [("file", &file), ("directory", &io), ("device", &made[0].2)] {
        for bit in mandatory {
            let (bits, list) = raw_attrs(&mut v, fh, &[bit]).await;
            assert_eq!(bits, Bitmap::of(&[bit]), "{what}: attribute {bit} answered");
            assert_eq!(verify(&mut v, fh, false, &bits, &list).await, NFS4_OK, "{what}: VERIFY of {bit}");
            assert_eq!(verify(&mut v, fh, true, &bits, &list).await, NFS4ERR_SAME, "{what}: NVERIFY of {bit}");
            let mut other = list.clone();
            *other.last_mut().unwrap() ^= 1;
            assert_eq!(verify(&mut v, fh, false, &bits, &other).await, NFS4ERR_NOT_SAME, "{what}: {bit} changed");
            assert_eq!(verify(&mut v, fh, true, &bits, &other).await, NFS4_OK, "{what}: NVERIFY of {bit} changed");
        }
        let (bits, list) = raw_attrs(&mut v, fh, &mandatory).await;
        assert_eq!(verify(&mut v, fh, false, &bits, &list).await, NFS4_OK, "{what}: all at once");
    }
    let size = |n: u64| {
        let mut l = Writer::new();
        l.u64(n);
        l.buf
    };
    let bits = Bitmap::of(&[attrs::SIZE]);
    assert_eq!(verify(&mut v, &file, false, &bits, &size(3)).await, NFS4_OK);
    assert_eq!(verify(&mut v, &file, false, &bits, &size(4)).await, NFS4ERR_NOT_SAME);
    for bit in [attrs::TIME_ACCESS_SET, attrs::TIME_MODIFY_SET, attrs::RDATTR_ERROR] {
        assert_eq!(verify(&mut v, &file, false, &Bitmap::of(&[bit]), &size(0)).await, NFS4ERR_INVAL, "{bit}");
    }
    assert_eq!(verify(&mut v, &file, false, &Bitmap::of(&[12]), &[]).await, NFS4ERR_ATTRNOTSUPP, "acl");

    // SECINFO_NO_NAME: AUTH_SYS for the object, and the filehandle consumed; the root's parent is out of reach,
    // a device has no children and SECINFO of a name needs a directory holding it.
    let secinfo_no_name = |style: u32| {
        move |o: &mut Ops| {
            o.op(OP_SECINFO_NO_NAME).u32(style);
            o.getfh();
        }
    };
    let flavors = 4 + 4;
    let codes = [(OP_PUTROOTFH, 0), (OP_SECINFO_NO_NAME, flavors), (OP_GETFH, 0)];
    let got = statuses(&mut v, |o| secinfo_no_name(0)(o.putrootfh()), &codes).await;
    assert_eq!(got, vec![NFS4_OK, NFS4_OK, NFS4ERR_NOFILEHANDLE]);
    let got = statuses(&mut v, |o| secinfo_no_name(1)(o.putrootfh()), &codes).await;
    assert_eq!(got, vec![NFS4_OK, NFS4ERR_NOENT]);
    let codes = [(OP_PUTFH, 0), (OP_SECINFO_NO_NAME, flavors), (OP_GETFH, 0)];
    let got = statuses(&mut v, |o| secinfo_no_name(1)(o.putfh(&io)), &codes).await;
    assert_eq!(got, vec![NFS4_OK, NFS4_OK, NFS4ERR_NOFILEHANDLE]);
    let got = statuses(&mut v, |o| secinfo_no_name(1)(o.putfh(&made[0].2)), &codes).await;
    assert_eq!(got, vec![NFS4_OK, NFS4ERR_NOTDIR]);
    let got = statuses(&mut v, |o| secinfo_no_name(0)(o.putfh(&made[0].2)), &codes).await;
    assert_eq!(got, vec![NFS4_OK, NFS4_OK, NFS4ERR_NOFILEHANDLE]);
    let codes = [(OP_PUTFH, 0), (OP_SECINFO, 0)];
    for (fh, name, want) in [(&io, "cdev", NFS4_OK), (&io, "missing", NFS4ERR_NOENT), (&file, "x", NFS4ERR_NOTDIR)] {
        let got = statuses(
            &mut v,
            |o| {
                o.putfh(fh).op(OP_SECINFO).opaque(name.as_bytes());
            },
            &codes,
        )
        .await;
        assert_eq!(got, vec![NFS4_OK, want], "SECINFO {name}");
    }
}
