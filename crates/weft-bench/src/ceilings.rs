//! Ceilings of this machine, measured in the same run as the system under test: loopback TCP (iperf3) and
//! memcpy. Plus the client's CPU time (getrusage) and a description of the machine.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// Loopback TCP bandwidth in MiB/s from one iperf3 run of `seconds`.
pub async fn iperf3_mib_per_s(seconds: u32) -> Result<f64> {
    let port = free_port()?;
    let mut server = tokio::process::Command::new("iperf3")
        .args(["-s", "-1", "-B", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("running iperf3 (install it with `make deps`, Debian package iperf3)")?;
    let mut last_err = String::new();
    // The server needs a moment to listen; try a few times.
    for _ in 0..50 {
        let out = tokio::process::Command::new("iperf3")
            .args(["-c", "127.0.0.1", "-p", &port.to_string(), "-t", &seconds.to_string(), "-J"])
            .output()
            .await
            .context("running the iperf3 client")?;
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if let Some(bps) = v.pointer("/end/sum_received/bits_per_second").and_then(Value::as_f64) {
            let _ = server.wait().await;
            return Ok(bps / 8.0 / (1 << 20) as f64);
        }
        last_err = v.pointer("/error").and_then(Value::as_str).unwrap_or("no result").to_string();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = server.kill().await;
    bail!("iperf3 gave no result: {last_err}")
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// memcpy bandwidth in MiB/s between two pre-faulted buffers of `bytes`.
pub fn memcpy_mib_per_s(bytes: usize) -> f64 {
    let src = vec![0x5au8; bytes];
    let mut dst = vec![0u8; bytes];
    dst.copy_from_slice(&src); // warm-up, and pre-faults dst
    let rounds = 8;
    let t = Instant::now();
    for _ in 0..rounds {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    }
    let secs = t.elapsed().as_secs_f64();
    (bytes * rounds) as f64 / secs / (1 << 20) as f64
}

pub fn load_average() -> Option<[f64; 3]> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = s.split_whitespace().map(|x| x.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

pub fn machine() -> Value {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("MemTotal:")).map(|l| l.to_string()))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|x| x.parse::<u64>().ok()))
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_default();
    json!({
        "cpu_model": cpu_model,
        "cores": cores,
        "memory_gib": (mem_kib as f64 / (1u64 << 20) as f64 * 10.0).round() / 10.0,
        "kernel": kernel,
        "load_average": load_average(),
    })
}

/// process_vm_readv bandwidth in MiB/s: `chunk`-byte reads from another process's pre-faulted buffer into this
/// one's, the copy a `shm` read makes (the data server copies into the client's buffer).
pub fn process_vm_readv_mib_per_s(chunk: usize, total: usize) -> Result<f64> {
    rusage::process_vm_readv_mib_per_s(chunk, total)
}

/// User plus system CPU seconds this process has used so far.
pub fn cpu_seconds() -> f64 {
    rusage::cpu_seconds(libc::RUSAGE_SELF)
}

/// User plus system CPU seconds of this process's children that have ended and been waited for (bench workers,
/// fio, nfs-cp; not the cluster's servers, which are reaped only when the cluster stops).
pub fn children_cpu_seconds() -> f64 {
    rusage::cpu_seconds(libc::RUSAGE_CHILDREN)
}

/// User plus system CPU seconds of the calling thread (a client running on one thread, such as libnfs's
/// synchronous calls).
pub fn thread_cpu_seconds() -> f64 {
    rusage::cpu_seconds(libc::RUSAGE_THREAD)
}

/// User plus system CPU seconds of process `pid` so far, all its threads (fields 14 and 15 of /proc/PID/stat, in
/// clock ticks); `None` when it is gone or unreadable.
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: the fields after the last ')' start at 3.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / rusage::clock_ticks_per_s())
}

/// The 1-minute load average (`uptime`'s first figure), or 0 where /proc/loadavg cannot be read.
pub fn load1() -> f64 {
    load_average().map_or(0.0, |l| l[0])
}

mod rusage {
    //! getrusage(2), sysconf(3), and fork/process_vm_readv for the shm ceiling (with `nfs::libnfs`, the only FFI in
    //! this crate).
    #![allow(unsafe_code)]

    use anyhow::{Result, bail};

    /// Forks a child that owns a pre-faulted `span`-byte buffer and waits; reads it `chunk` bytes at a time.
    pub fn process_vm_readv_mib_per_s(chunk: usize, total: usize) -> Result<f64> {
        let span = 64usize << 20;
        let chunk = chunk.clamp(4096, span);
        let mut src = vec![1u8; span];
        let src_mut = src.as_mut_ptr();
        let mut dst = vec![0u8; chunk * 8];
        let mut fds = [0i32; 2];
        // SAFETY: `fds` is a writable array of two ints, as pipe(2) requires.
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            bail!("pipe: {}", std::io::Error::last_os_error());
        }
        // SAFETY: the child only calls async-signal-safe functions (memset through write_bytes, write, pause,
        // _exit) and never returns into Rust code, so forking a multi-threaded process is sound here.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            bail!("fork: {}", std::io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: child side: `src` is a live allocation of `span` bytes (our private copy after fork); the
            // pipe's write end is open. Touching every page makes them the child's own (no shared COW pages).
            unsafe {
                std::ptr::write_bytes(src_mut, 2, span);
                libc::write(fds[1], b"r".as_ptr().cast(), 1);
                loop {
                    libc::pause();
                }
            }
        }
        let mut b = [0u8; 1];
        // SAFETY: reading one byte into a live one-byte buffer from the pipe's read end.
        unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 1) };
        let t = std::time::Instant::now();
        let mut done = 0usize;
        let mut i = 0usize;
        let mut failed = None;
        while done < total {
            let off = (i * chunk) % span;
            let d = (i % 8) * chunk;
            let local = libc::iovec { iov_base: dst[d..].as_mut_ptr().cast(), iov_len: chunk };
            let remote = libc::iovec { iov_base: (src.as_ptr() as usize + off) as *mut libc::c_void, iov_len: chunk };
            // SAFETY: `local` covers `chunk` writable bytes of `dst`; `remote` names memory of the child, which
            // the kernel checks (we only read it).
            let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
            if n != chunk as isize {
                failed = Some(std::io::Error::last_os_error());
                break;
            }
            done += chunk;
            i += 1;
        }
        let secs = t.elapsed().as_secs_f64();
        // SAFETY: `pid` is our child; killing and reaping it has no other preconditions. The fds are ours.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        if let Some(e) = failed {
            bail!("process_vm_readv: {e}");
        }
        Ok(done as f64 / secs / (1 << 20) as f64)
    }

    /// sysconf(_SC_CLK_TCK): the unit of /proc/PID/stat's CPU times (100 where it cannot be read).
    pub fn clock_ticks_per_s() -> f64 {
        // SAFETY: sysconf only reads a configuration value.
        let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        if t > 0 { t as f64 } else { 100.0 }
    }

    /// `who` is RUSAGE_SELF, RUSAGE_CHILDREN or RUSAGE_THREAD.
    pub fn cpu_seconds(who: libc::c_int) -> f64 {
        // SAFETY: an all-zero rusage is a valid value of this plain C struct.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `ru` is a valid, writable rusage and `who` one of the two values getrusage accepts here.
        let rc = unsafe { libc::getrusage(who, &mut ru) };
        if rc != 0 {
            return 0.0;
        }
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        tv(ru.ru_utime) + tv(ru.ru_stime)
    }
}
