//! A small NFSv4.1 client written from weft-nfs's own XDR code, for tests that talk to an NFSv4.1 server
//! directly (a pNFS data server, the gateway): one connection, one session with slot 0, compounds built op by op
//! and their results read in order.

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use weft_nfs::nfs4::attrs::Bitmap;
use weft_nfs::nfs4::consts::*;
use weft_nfs::proto::NFS_PROGRAM;
use weft_nfs::rpc::{self, RecordLimits, ReplyHead};
use weft_nfs::xdr::{Reader, Writer};

/// The AUTH_SYS user the client's calls carry.
pub const UID: u32 = 4242;

/// The ops of one compound being built.
#[derive(Default)]
pub struct Ops {
    pub w: Writer,
    pub n: u32,
}

impl Ops {
    pub fn op(&mut self, code: u32) -> &mut Writer {
        self.n += 1;
        self.w.u32(code);
        &mut self.w
    }
    pub fn putfh(&mut self, fh: &[u8]) -> &mut Self {
        self.op(OP_PUTFH).opaque(fh);
        self
    }
    /// WRITE with the anonymous stateid (a data server does not check it).
    pub fn write(&mut self, offset: u64, stable: u32, data: &[u8]) -> &mut Self {
        self.op(OP_WRITE).u32(0).fixed(&[0; 12]).u64(offset).u32(stable).opaque(data);
        self
    }
    pub fn read(&mut self, offset: u64, count: u32) -> &mut Self {
        self.op(OP_READ).u32(0).fixed(&[0; 12]).u64(offset).u32(count);
        self
    }
    pub fn commit(&mut self, offset: u64, count: u32) -> &mut Self {
        self.op(OP_COMMIT).u64(offset).u32(count);
        self
    }
    pub fn getattr(&mut self, bits: &[u32]) -> &mut Self {
        let w = self.op(OP_GETATTR);
        Bitmap::of(bits).encode(w);
        self
    }
}

/// A reply being read: the compound's status, then each op's code and status, then its body as the caller reads.
pub struct Res {
    pub buf: Vec<u8>,
    pub pos: usize,
    pub status: u32,
}

impl Res {
    pub fn with<T>(&mut self, f: impl FnOnce(&mut Reader<'_>) -> T) -> T {
        let mut r = Reader::new(&self.buf);
        r.fixed(self.pos).unwrap();
        let t = f(&mut r);
        self.pos = r.position();
        t
    }
    /// The next op's status (its code checked).
    pub fn op(&mut self, code: u32) -> u32 {
        self.with(|r| {
            assert_eq!(r.u32().unwrap(), code, "result op code");
            r.u32().unwrap()
        })
    }
    pub fn ok(&mut self, code: u32) {
        let s = self.op(code);
        assert_eq!(s, NFS4_OK, "op {code} failed");
    }
    pub fn seq(&mut self) {
        self.ok(OP_SEQUENCE);
        self.with(|r| {
            r.fixed(16 + 20).unwrap();
        });
    }
    /// READ's result: (eof, data).
    pub fn read(&mut self) -> (bool, Vec<u8>) {
        self.ok(OP_READ);
        self.with(|r| (r.bool().unwrap(), r.opaque(1 << 21).unwrap().to_vec()))
    }
    /// WRITE's result: (count, committed, verifier).
    pub fn write(&mut self) -> (u32, u32, [u8; 8]) {
        self.ok(OP_WRITE);
        self.with(|r| (r.u32().unwrap(), r.u32().unwrap(), r.fixed(8).unwrap().try_into().unwrap()))
    }
    /// COMMIT's result: the verifier.
    pub fn commit(&mut self) -> [u8; 8] {
        self.ok(OP_COMMIT);
        self.with(|r| r.fixed(8).unwrap().try_into().unwrap())
    }
}

/// One NFSv4.1 client: a connection and (after `session`) a session with slot 0 used.
pub struct V41 {
    pub s: TcpStream,
    pub xid: u32,
    pub sid: [u8; 16],
    pub seqid: u32,
    pub clientid: u64,
    /// EXCHANGE_ID's `eir_flags`.
    pub flags: u32,
}

impl V41 {
    pub async fn connect(addr: impl tokio::net::ToSocketAddrs) -> V41 {
        V41 { s: TcpStream::connect(addr).await.unwrap(), xid: 0, sid: [0; 16], seqid: 0, clientid: 0, flags: 0 }
    }

    /// One RPC; the accepted reply's body.
    pub async fn rpc(&mut self, vers: u32, proc_: u32, args: &[u8]) -> (u32, Vec<u8>) {
        self.xid += 1;
        let mut w = rpc::encode_call(self.xid, NFS_PROGRAM, vers, proc_, Some((UID, UID, &[])));
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
    pub fn args(minor: u32, ops: &Ops) -> Vec<u8> {
        let mut w = Writer::new();
        w.opaque(b"weft-test").u32(minor).u32(ops.n);
        w.buf.extend_from_slice(&ops.w.buf);
        w.buf
    }

    pub async fn send(&mut self, args: &[u8]) -> Res {
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
    pub async fn seq(&mut self, f: impl FnOnce(&mut Ops)) -> Res {
        self.seqid += 1;
        let mut ops = Ops::default();
        ops.op(OP_SEQUENCE).fixed(&self.sid).u32(self.seqid).u32(0).u32(0).bool(true);
        f(&mut ops);
        let args = V41::args(1, &ops);
        self.send(&args).await
    }

    /// SEQUENCE, PUTFH `fh`, then `f`'s ops; checks that SEQUENCE and PUTFH succeeded and returns the rest.
    pub async fn on_fh(&mut self, fh: &[u8], f: impl FnOnce(&mut Ops)) -> Res {
        let mut res = self
            .seq(|o| {
                f(o.putfh(fh));
            })
            .await;
        res.seq();
        res.ok(OP_PUTFH);
        res
    }

    /// EXCHANGE_ID, CREATE_SESSION, RECLAIM_COMPLETE.
    pub async fn session(&mut self, owner: &[u8]) {
        let mut ops = Ops::default();
        let w = ops.op(OP_EXCHANGE_ID);
        w.fixed(&[7; 8]).opaque(owner).u32(0).u32(0).u32(0);
        let mut res = self.send(&V41::args(1, &ops)).await;
        res.ok(OP_EXCHANGE_ID);
        let (clientid, seq, flags) = res.with(|r| (r.u64().unwrap(), r.u32().unwrap(), r.u32().unwrap()));
        (self.clientid, self.flags) = (clientid, flags);
        let mut ops = Ops::default();
        let w = ops.op(OP_CREATE_SESSION);
        w.u64(clientid).u32(seq).u32(0);
        w.u32(0).u32((1 << 20) + 4096).u32((1 << 20) + 4096).u32(8192).u32(16).u32(8).u32(0);
        w.u32(0).u32(4096).u32(4096).u32(0).u32(2).u32(1).u32(0);
        w.u32(0x4000_0000).u32(1).u32(0);
        let mut res = self.send(&V41::args(1, &ops)).await;
        res.ok(OP_CREATE_SESSION);
        self.sid = res.with(|r| r.fixed(16).unwrap().try_into().unwrap());
        self.seqid = 0;
        let mut res = self
            .seq(|o| {
                o.op(OP_RECLAIM_COMPLETE).bool(false);
            })
            .await;
        res.seq();
        res.ok(OP_RECLAIM_COMPLETE);
    }
}
