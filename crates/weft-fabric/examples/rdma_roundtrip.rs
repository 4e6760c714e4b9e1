//! A file round trip over the `rdma` backend, in the Read-Write design: the server initiates every transfer.
//!
//! ```text
//! rdma_roundtrip server LISTEN_ADDR OUT_FILE [--device NAME] [--gid-index N] [--buffer-mib N]
//! rdma_roundtrip client CONNECT_ADDR IN_FILE [--device NAME] [--gid-index N]
//! ```
//! The client registers two regions (its file's bytes, readable; an empty landing area, writable) and advertises
//! them in its session. WRITE names the first: the server RDMA-READs it into its own registered buffer and writes it
//! to OUT_FILE. READ names the second: the server reads OUT_FILE back into its buffer and RDMA-WRITEs it into the
//! client's region, then replies (RC ordering makes the reply the completion). Between the two, the client sends a
//! rogue READ whose chunk runs past its region: the server must refuse it and keep serving. The client compares
//! CRC-32C of the original and returned bytes and prints `RDMA-ROUNDTRIP: PASS` or `RDMA-ROUNDTRIP: FAIL`.
//! The server busy-polls its completion queues; the client sleeps on a completion channel (evented).
//! Run inside the Soft-RoCE VM by `make test-rdma` (scripts/rdma-vm/guest/roundtrip.sh).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use weft_fabric::rdma::{Device, DeviceConfig, Endpoint, EndpointConfig, MemoryRegion, RemoteRegion};

const OP_REGION: u8 = 1;
const OP_WRITE: u8 = 2;
const OP_READ: u8 = 3;
const OP_BYE: u8 = 4;
const ST_OK: u8 = 0;
const ST_REFUSED: u8 = 1;
const ST_ERROR: u8 = 2;
/// Regions a client may register in its session, and chunks per request: bounded like every table in Weft.
const SESSION_REGIONS_MAX: usize = 16;
const CHUNKS_MAX: usize = 64;

fn main() {
    match run() {
        Ok(()) => {}
        Err(e) => {
            eprintln!("rdma_roundtrip: {e:#}");
            println!("RDMA-ROUNDTRIP: FAIL ({e})");
            std::process::exit(1);
        }
    }
}

struct Opts {
    device: DeviceConfig,
    buffer_bytes: usize,
}

fn parse_opts(rest: &[String]) -> Result<Opts> {
    let mut opts = Opts { device: DeviceConfig::default(), buffer_bytes: 4 << 20 };
    let mut it = rest.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| anyhow!("{flag} needs a value"))?;
        match flag.as_str() {
            "--device" => opts.device.name = Some(value.clone()),
            "--gid-index" => opts.device.gid_index = Some(value.parse().context("--gid-index")?),
            "--buffer-mib" => opts.buffer_bytes = value.parse::<usize>().context("--buffer-mib")? << 20,
            other => bail!("unknown option {other}"),
        }
    }
    Ok(opts)
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("server") if args.len() >= 3 => server(&args[1], &args[2], parse_opts(&args[3..])?),
        Some("client") if args.len() >= 3 => client(&args[1], &args[2], parse_opts(&args[3..])?),
        _ => bail!("usage: rdma_roundtrip server LISTEN_ADDR OUT_FILE | client CONNECT_ADDR IN_FILE [options]"),
    }
}

fn reply(ep: &mut Endpoint, status: u8, crc: u32, len: u64, text: &str) -> Result<()> {
    let mut msg = vec![status];
    msg.extend_from_slice(&crc.to_le_bytes());
    msg.extend_from_slice(&len.to_le_bytes());
    msg.extend_from_slice(text.as_bytes());
    msg.truncate(ep.payload_bytes_max());
    Ok(ep.send(&msg)?)
}

fn server(listen: &str, out_path: &str, opts: Opts) -> Result<()> {
    let dev = Device::open(&opts.device)?;
    // The server's buffer: registered once, local access only (the server never exposes its memory).
    let mut buf = MemoryRegion::new(&dev, opts.buffer_bytes, false, false)?;
    let listener = std::net::TcpListener::bind(listen).with_context(|| format!("bind {listen}"))?;
    eprintln!("server: {} gid {:02x?} listening on {listen}", dev.name(), dev.gid());
    let mut ep = Endpoint::accept(&dev, &listener, EndpointConfig::default())?;
    let mut regions: Vec<RemoteRegion> = Vec::new();
    let mut stored_len = 0u64;
    loop {
        let req = ep.recv(|m| m.to_vec())?;
        let (&op, body) = req.split_first().ok_or_else(|| anyhow!("empty request"))?;
        if op == OP_BYE {
            eprintln!("server: client said bye");
            return Ok(());
        }
        let chunks = match decode_chunks(body) {
            Ok(c) => c,
            Err(e) => {
                reply(&mut ep, ST_ERROR, 0, 0, &e.to_string())?;
                continue;
            }
        };
        let total: u64 = chunks.iter().map(|c| c.len).sum(); // no overflow: each decoded chunk fits below 2^64
        match op {
            OP_REGION if chunks.len() == 1 && regions.len() < SESSION_REGIONS_MAX => {
                regions.push(chunks[0]);
                reply(&mut ep, ST_OK, 0, 0, "")?;
            }
            OP_REGION => reply(&mut ep, ST_REFUSED, 0, 0, "one region per request, at most 16")?,
            OP_WRITE | OP_READ if !chunks.iter().all(|c| regions.iter().any(|r| r.contains(c))) => {
                eprintln!("server: refused chunk list {chunks:?}: outside the client's registered regions");
                reply(&mut ep, ST_REFUSED, 0, 0, "chunk outside registered regions")?;
            }
            OP_WRITE => {
                // GET the client's bytes at the server's pace, one buffer at a time, straight to disk.
                let mut out = File::create(out_path).with_context(|| format!("create {out_path}"))?;
                let started = Instant::now();
                let mut crc = 0u32;
                let mut off = 0u64;
                while off < total {
                    let n = (total - off).min(buf.len() as u64);
                    ep.read_chunks(&mut buf, 0, &sub_chunks(&chunks, off, n))?;
                    let bytes = &buf.as_slice()[..n as usize];
                    crc = crc32c::crc32c_append(crc, bytes);
                    out.write_all(bytes)?;
                    off += n;
                }
                out.sync_all()?;
                stored_len = total;
                eprintln!("server: RDMA READ {total} bytes from {} chunks in {:?}", chunks.len(), started.elapsed());
                reply(&mut ep, ST_OK, crc, total, "")?;
            }
            OP_READ => {
                if total > stored_len {
                    reply(&mut ep, ST_ERROR, 0, 0, "read past the stored data")?;
                    continue;
                }
                // PUT the stored bytes into the client's region, then reply: the reply is the completion.
                let mut file = File::open(out_path)?;
                file.seek(SeekFrom::Start(0))?;
                let started = Instant::now();
                let mut crc = 0u32;
                let mut off = 0u64;
                while off < total {
                    let n = (total - off).min(buf.len() as u64);
                    file.read_exact(&mut buf.as_mut_slice()[..n as usize])?;
                    crc = crc32c::crc32c_append(crc, &buf.as_slice()[..n as usize]);
                    ep.write_chunks(&buf, 0, &sub_chunks(&chunks, off, n))?;
                    off += n;
                }
                eprintln!("server: RDMA WRITE {total} bytes into {} chunks in {:?}", chunks.len(), started.elapsed());
                reply(&mut ep, ST_OK, crc, total, "")?;
            }
            other => reply(&mut ep, ST_ERROR, 0, 0, &format!("unknown op {other}"))?,
        }
    }
}

/// A request's chunk list: 1..=CHUNKS_MAX region descriptors back to back.
fn decode_chunks(body: &[u8]) -> Result<Vec<RemoteRegion>> {
    let size = RemoteRegion::ENCODED_BYTES;
    if body.is_empty() || !body.len().is_multiple_of(size) || body.len() / size > CHUNKS_MAX {
        bail!("a chunk list of {} bytes is not 1..={CHUNKS_MAX} descriptors", body.len());
    }
    let chunks = body.chunks_exact(size).map(RemoteRegion::decode).collect::<Result<Vec<_>, _>>()?;
    chunks.iter().try_fold(0u64, |sum, c| sum.checked_add(c.len)).ok_or_else(|| anyhow!("chunk lengths overflow"))?;
    Ok(chunks)
}

/// The part of a chunk list that covers bytes `off..off + len` of its concatenation: one transfer unit's worth.
fn sub_chunks(chunks: &[RemoteRegion], mut off: u64, mut len: u64) -> Vec<RemoteRegion> {
    let mut out = Vec::new();
    for c in chunks {
        if len == 0 {
            break;
        }
        if off >= c.len {
            off -= c.len;
            continue;
        }
        let n = (c.len - off).min(len);
        out.push(RemoteRegion { addr: c.addr + off, len: n, rkey: c.rkey });
        off = 0;
        len -= n;
    }
    out
}

/// Splits a region into three uneven chunks (so transfers cross chunk and buffer boundaries mid-way).
fn three_chunks(r: &RemoteRegion) -> Vec<RemoteRegion> {
    let a = r.len / 3 + 1;
    let b = (r.len / 2).max(a);
    [(0, a.min(r.len)), (a.min(r.len), b - a.min(r.len)), (b, r.len - b)]
        .into_iter()
        .filter(|&(_, len)| len > 0)
        .map(|(off, len)| RemoteRegion { addr: r.addr + off, len, rkey: r.rkey })
        .collect()
}

struct Reply {
    status: u8,
    crc: u32,
    len: u64,
    text: String,
}

fn call(ep: &mut Endpoint, op: u8, chunks: &[RemoteRegion]) -> Result<Reply> {
    let mut msg = vec![op];
    for c in chunks {
        msg.extend_from_slice(&c.encode());
    }
    ep.send(&msg)?;
    ep.recv(|m| {
        if m.len() < 13 {
            bail!("short reply of {} bytes", m.len());
        }
        Ok(Reply {
            status: m[0],
            crc: u32::from_le_bytes(m[1..5].try_into()?),
            len: u64::from_le_bytes(m[5..13].try_into()?),
            text: String::from_utf8_lossy(&m[13..]).into_owned(),
        })
    })?
}

fn connect_retrying(dev: &Device, addr: &str) -> Result<Endpoint> {
    // The server may still be starting: retry the side channel for a bounded time, not a fixed sleep.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match std::net::TcpStream::connect(addr) {
            Ok(mut stream) => {
                // Clients sleep on completion events; the server busy-polls.
                let cfg = EndpointConfig { evented: true, ..EndpointConfig::default() };
                return Ok(Endpoint::over_tcp(dev, &mut stream, cfg)?);
            }
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e).with_context(|| format!("connect {addr}")),
        }
    }
}

fn client(addr: &str, in_path: &str, opts: Opts) -> Result<()> {
    let data = std::fs::read(in_path).with_context(|| format!("read {in_path}"))?;
    if data.is_empty() {
        bail!("{in_path} is empty");
    }
    let dev = Device::open(&opts.device)?;
    // Source: the file's bytes, remotely readable. Landing area: remotely writable, zeroed.
    let mut src = MemoryRegion::new(&dev, data.len(), true, false)?;
    src.as_mut_slice().copy_from_slice(&data);
    let dst = MemoryRegion::new(&dev, data.len(), false, true)?;
    let mut ep = connect_retrying(&dev, addr)?;
    eprintln!("client: connected over {} ({ep:?}, evented, completion fd {:?})", dev.name(), ep.completion_fd());
    for region in [src.remote(), dst.remote()] {
        let r = call(&mut ep, OP_REGION, &[region])?;
        if r.status != ST_OK {
            bail!("region refused: {}", r.text);
        }
    }
    let want = crc32c::crc32c(src.as_slice());

    let started = Instant::now();
    let w = call(&mut ep, OP_WRITE, &three_chunks(&src.remote()))?;
    let write_s = started.elapsed().as_secs_f64();
    if w.status != ST_OK || w.crc != want || w.len != data.len() as u64 {
        bail!("WRITE: status {} crc {:#010x} (want {want:#010x}) len {}: {}", w.status, w.crc, w.len, w.text);
    }

    // A rogue chunk list: its last chunk runs one page past the landing area. Must be refused, nothing may be
    // written, and the session must go on.
    let mut rogue = three_chunks(&dst.remote());
    if let Some(last) = rogue.last_mut() {
        last.len += 4096;
    }
    let r = call(&mut ep, OP_READ, &rogue)?;
    if r.status != ST_REFUSED {
        bail!("rogue READ was not refused (status {})", r.status);
    }
    eprintln!("client: rogue chunk refused: {}", r.text);

    let started = Instant::now();
    if dst.as_slice().iter().any(|&b| b != 0) {
        bail!("the refused READ wrote into the landing area");
    }
    let r = call(&mut ep, OP_READ, &three_chunks(&dst.remote()))?;
    let read_s = started.elapsed().as_secs_f64();
    if r.status != ST_OK {
        bail!("READ: status {}: {}", r.status, r.text);
    }
    let got = crc32c::crc32c(dst.as_slice());
    ep.send(&[OP_BYE])?;
    let mib = data.len() as f64 / f64::from(1 << 20);
    if got != want || r.crc != want {
        bail!("checksums differ: sent {want:#010x}, server stored {:#010x}, got back {got:#010x}", r.crc);
    }
    println!(
        "RDMA-ROUNDTRIP: PASS bytes={} crc32c={want:#010x} write(rdma read)={:.1} MiB/s read(rdma write)={:.1} MiB/s",
        data.len(),
        mib / write_s,
        mib / read_s
    );
    Ok(())
}
