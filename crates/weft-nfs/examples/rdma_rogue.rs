//! A rogue NFS-over-RDMA client for the VM test (scripts/rdma-vm/guest/nfs-rdma.sh): it connects to a gateway's
//! `--rdma-listen` address with RDMA CM, built from weft-nfs's RPC-over-RDMA codec and weft-fabric's verbs, and
//! checks that the gateway writes nothing outside what a client offered:
//!
//! 1. an NFSv3 READ of 8 KiB offering a write chunk of 100 bytes gets RDMA_ERROR ERR_CHUNK, and not a byte of
//!    the client's registered sink changes;
//! 2. a READ offering a write chunk under a bogus handle gets no reply: the gateway's RDMA WRITE fails and it
//!    drops that connection (the client sees its queue pair go down);
//! 3. a READ on a new connection offering a proper chunk gets the file's first 8 KiB, equal to the local copy.
//!
//! usage: rdma_rogue ADDR:PORT NAME LOCAL_COPY   (NAME a file in the export's root; prints `rdma_rogue: PASS`)

use std::net::SocketAddr;
use std::time::Duration;

use weft_fabric::rdma::{CmConn, MemoryRegion};
use weft_nfs::rdma::header::{ERR_CHUNK, RDMA_ERROR};
use weft_nfs::rdma::{Decoded, HeaderLimits, PrivateData, Segment, decode, encode_reply_header};
use weft_nfs::rpc::{self, ReplyHead};
use weft_nfs::xdr::Reader;

const INLINE: usize = 4096;
const RECVS: u64 = 4;
const READ_BYTES: u32 = 8192;

struct Client {
    conn: CmConn,
    recv: MemoryRegion,
    send: MemoryRegion,
    sink: MemoryRegion,
    xid: u32,
}

enum Answer {
    Message(Vec<u8>),
    /// The connection went down (a flushed receive or a disconnect).
    Down(String),
}

impl Client {
    fn connect(addr: SocketAddr) -> Result<Client, String> {
        let pd = PrivateData { remote_invalidate: false, send_bytes: INLINE, recv_bytes: INLINE }.encode();
        let conn = CmConn::connect(addr, &pd, 16, RECVS as u32).map_err(|e| format!("connect: {e}"))?;
        let dev = conn.device().clone();
        let recv = MemoryRegion::new(&dev, INLINE * RECVS as usize, false, false).map_err(|e| e.to_string())?;
        let send = MemoryRegion::new(&dev, INLINE, false, false).map_err(|e| e.to_string())?;
        let sink = MemoryRegion::new(&dev, READ_BYTES as usize, false, true).map_err(|e| e.to_string())?;
        for i in 0..RECVS {
            conn.post_recv(&recv, i as usize * INLINE, INLINE, i).map_err(|e| e.to_string())?;
        }
        Ok(Client { conn, recv, send, sink, xid: 0x5000 })
    }

    /// Sends one RDMA_MSG call offering `writes`, returns the answer.
    fn call(&mut self, rpc_msg: &[u8], writes: &[Vec<Segment>]) -> Result<Answer, String> {
        self.xid += 1;
        let mut msg = encode_reply_header(self.xid, RECVS as u32, false, writes, None);
        msg.extend_from_slice(rpc_msg);
        assert!(msg.len() <= INLINE, "calls here are small");
        self.send.as_mut_slice()[..msg.len()].copy_from_slice(&msg);
        self.conn.post_send(&[(&self.send, 0, msg.len())], 1 << 40).map_err(|e| e.to_string())?;
        let mut got = None;
        let mut sent = false;
        for _ in 0..24 {
            match self.conn.next_completion(Duration::from_secs(5)) {
                Ok(None) => {}
                Ok(Some(c)) if c.wr_id < RECVS => {
                    let at = c.wr_id as usize * INLINE;
                    got = Some(self.recv.as_slice()[at..at + c.byte_len as usize].to_vec());
                    self.conn.post_recv(&self.recv, at, INLINE, c.wr_id).map_err(|e| e.to_string())?;
                }
                Ok(Some(_)) => sent = true,
                Err(e) => return Ok(Answer::Down(e.to_string())),
            }
            if let (Some(m), true) = (&got, sent) {
                return Ok(Answer::Message(m.clone()));
            }
        }
        Err("no answer within two minutes".into())
    }

    /// An RPC reply carried inline: its accepted body after the RPC header.
    fn rpc_body(answer: Answer) -> Result<Vec<u8>, String> {
        let Answer::Message(m) = answer else { return Err("the connection went down".into()) };
        match decode(&m, &HeaderLimits::default()) {
            Ok(Decoded::Call(_, inline)) => match rpc::parse_reply(inline) {
                Ok(ReplyHead::Accepted { stat: 0, rest, .. }) => Ok(rest.to_vec()),
                other => Err(format!("RPC reply: {other:?}")),
            },
            other => Err(format!("transport header: {other:?}")),
        }
    }

    fn lookup(&mut self, name: &str) -> Result<Vec<u8>, String> {
        let mut w = rpc::encode_call(1, weft_nfs::proto::MOUNT_PROGRAM, 3, weft_nfs::mount::MNT, Some((0, 0, &[])));
        w.opaque(b"/");
        let body = Self::rpc_body(self.call(&w.buf, &[])?)?;
        let mut r = Reader::new(&body);
        if r.u32().map_err(|e| e.to_string())? != 0 {
            return Err("MNT refused".into());
        }
        let root = r.opaque(64).map_err(|e| e.to_string())?.to_vec();
        let mut w = rpc::encode_call(2, weft_nfs::proto::NFS_PROGRAM, 3, 3, Some((0, 0, &[])));
        w.opaque(&root).opaque(name.as_bytes());
        let body = Self::rpc_body(self.call(&w.buf, &[])?)?;
        let mut r = Reader::new(&body);
        if r.u32().map_err(|e| e.to_string())? != 0 {
            return Err(format!("LOOKUP {name} failed"));
        }
        Ok(r.opaque(64).map_err(|e| e.to_string())?.to_vec())
    }

    fn read(&mut self, fh: &[u8], chunk: Segment) -> Result<Answer, String> {
        let mut w = rpc::encode_call(3, weft_nfs::proto::NFS_PROGRAM, 3, 6, Some((0, 0, &[])));
        w.opaque(fh).u64(0).u32(READ_BYTES);
        self.call(&w.buf, &[vec![chunk]])
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let [_, addr, name, local] = &args[..] else { return Err("usage: rdma_rogue ADDR:PORT NAME LOCAL_COPY".into()) };
    let addr: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let want = std::fs::read(local).map_err(|e| format!("{local}: {e}"))?;
    let want = &want[..want.len().min(READ_BYTES as usize)];

    let mut c = Client::connect(addr)?;
    let fh = c.lookup(name)?;
    // 1. A chunk too small for the data: ERR_CHUNK, nothing written.
    let small = Segment { handle: c.sink.rkey(), length: 100, offset: c.sink.addr() };
    match c.read(&fh, small)? {
        Answer::Message(m)
            if m.len() >= 20 && m[12..16] == RDMA_ERROR.to_be_bytes() && m[16..20] == ERR_CHUNK.to_be_bytes() => {}
        Answer::Message(m) => {
            return Err(format!("a too-small write chunk got {:02x?}, not ERR_CHUNK", &m[..m.len().min(40)]));
        }
        Answer::Down(e) => return Err(format!("a too-small write chunk dropped the connection: {e}")),
    }
    if c.sink.as_slice().iter().any(|&b| b != 0) {
        return Err("the gateway wrote into a chunk too small for the reply".into());
    }
    println!("rdma_rogue: a write chunk smaller than the data was refused with ERR_CHUNK, nothing written");
    // 2. A bogus handle: the gateway's RDMA WRITE fails, it drops the connection.
    let bogus = Segment { handle: c.sink.rkey() ^ 0x00a5_5a00, length: READ_BYTES, offset: c.sink.addr() };
    match c.read(&fh, bogus)? {
        Answer::Down(e) => println!("rdma_rogue: a write chunk under a bogus handle ended the connection ({e})"),
        Answer::Message(m) => {
            let header = decode(&m, &HeaderLimits::default());
            // A reply reporting 0 bytes written, or an error, is also a refusal; data reported written is not.
            if let Ok(Decoded::Call(h, _)) = &header
                && h.writes.first().and_then(|w| w.first()).is_some_and(|s| s.length > 0)
            {
                return Err("a bogus handle got a reply reporting data written".into());
            }
            println!("rdma_rogue: a write chunk under a bogus handle was refused: {header:?}");
        }
    }
    drop(c);
    // 3. A proper read on a new connection: the gateway kept serving.
    let mut c = Client::connect(addr)?;
    let fh = c.lookup(name)?;
    let chunk = Segment { handle: c.sink.rkey(), length: READ_BYTES, offset: c.sink.addr() };
    let Answer::Message(m) = c.read(&fh, chunk)? else { return Err("a proper READ lost its connection".into()) };
    let Ok(Decoded::Call(h, _)) = decode(&m, &HeaderLimits::default()) else {
        return Err("a proper READ got no RDMA_MSG".into());
    };
    let written = h.writes.first().map_or(0, |w| w.iter().map(|s| s.length as usize).sum());
    if written != want.len() || &c.sink.as_slice()[..written] != want {
        return Err(format!("a proper READ wrote {written} bytes, not the file's first {}", want.len()));
    }
    println!("rdma_rogue: a proper READ on a new connection got the file's first {written} bytes by RDMA WRITE");
    Ok(())
}

fn main() {
    match run() {
        Ok(()) => println!("rdma_rogue: PASS"),
        Err(e) => {
            println!("rdma_rogue: FAIL: {e}");
            std::process::exit(1);
        }
    }
}
