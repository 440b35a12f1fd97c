//! Storage faults against real processes: damage in the data dir refuses a
//! start (naming the file), a torn tail is cut without losing an
//! acknowledged write, and a disk that fails under a running server stops
//! it (restarting clean on a good disk).

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::{Server, ServerBuilder, free_port};

/// Small segments, so a few writes span several files.
const SEGMENT_BYTES: &str = "8192";

fn builder(dir: &Path) -> ServerBuilder {
    Server::builder()
        .node("s1")
        .data_dir(dir)
        .http_port(free_port())
        .raft_port(free_port())
        .bootstrap_expect(1)
        .arg("--raft-log-segment-bytes")
        .arg(SEGMENT_BYTES)
}

fn put(s: &Server, key: &str, value: &str) {
    let r = s.put(&format!("/v1/kv/{key}"), value);
    assert_eq!((r.status, r.body.trim()), (200, "true"), "PUT {key}");
}

fn get(s: &Server, key: &str) -> Option<String> {
    let r = s.get(&format!("/v1/kv/{key}?raw"));
    match r.status {
        200 => Some(r.body),
        404 => None,
        other => panic!("GET {key}: {other} {}", r.body),
    }
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("raft-log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

/// Starts `cairn server` on `dir` and waits for it to exit on its own
/// (killing it after `timeout`): its exit status, or `None` if it was
/// still running, and everything it wrote to stderr.
fn run_until_exit(dir: &Path, timeout: Duration) -> (Option<ExitStatus>, String) {
    let log = dir.with_extension("stderr");
    let mut child = Command::new(common::bin())
        .args(["server", "--node", "s1", "--bootstrap-expect", "1"])
        .args(["--raft-log-segment-bytes", SEGMENT_BYTES])
        .arg("--data-dir")
        .arg(dir)
        .args(["--http-addr", &format!("127.0.0.1:{}", free_port())])
        .args(["--raft-addr", &format!("127.0.0.1:{}", free_port())])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status, std::fs::read_to_string(&log).unwrap_or_default())
}

/// A server on `dir` holding `n` acknowledged keys across several log
/// segments, stopped cleanly; returns the keys' values.
fn fill(dir: &Path, n: usize) -> Vec<(String, String)> {
    let mut s = builder(dir).start();
    let written: Vec<(String, String)> = (0..n)
        .map(|i| (format!("k/{i:04}"), format!("{i}-{}", "x".repeat(500))))
        .collect();
    for (k, v) in &written {
        put(&s, k, v);
    }
    s.stop(Duration::from_secs(10));
    written
}

fn flip(path: &Path, at: u64) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x5a], at).unwrap();
}

#[test]
fn a_byte_changed_in_the_first_of_several_segments_refuses_to_start() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    fill(&dir, 60);
    let segs = segments(&dir);
    assert!(segs.len() >= 3, "expected several segments: {segs:?}");
    let sizes: Vec<u64> = segs
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .collect();
    flip(&segs[0], sizes[0] / 2);

    let (status, stderr) = run_until_exit(&dir, Duration::from_secs(30));
    let status = status.unwrap_or_else(|| panic!("the server started anyway:\n{stderr}"));
    assert!(!status.success(), "exit {status}:\n{stderr}");
    let first = segs[0].display().to_string();
    assert!(
        stderr.contains(&first) && stderr.contains("corrupt at offset"),
        "stderr does not name {first}:\n{stderr}"
    );
    // Nothing was cut or removed on the way.
    assert_eq!(segments(&dir), segs);
    let after: Vec<u64> = segs
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .collect();
    assert_eq!(after, sizes);
}

#[test]
fn a_torn_last_segment_is_cut_and_nothing_acknowledged_is_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let written = fill(&dir, 40);
    let segs = segments(&dir);
    assert!(segs.len() >= 2, "{segs:?}");
    // What a crash in the middle of an append leaves: a record whose
    // length reached the disk, its data only in part.
    let last = segs.last().unwrap();
    let len = std::fs::metadata(last).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(last).unwrap();
    let mut torn = 3000u32.to_le_bytes().to_vec();
    torn.extend_from_slice(&[0xab; 700]);
    f.write_all_at(&torn, len).unwrap();
    drop(f);

    let s = builder(&dir).start();
    assert!(
        s.log().contains("cutting a torn tail"),
        "no torn tail logged:\n{}",
        s.log()
    );
    assert!(s.log().contains(&last.display().to_string()));
    for (k, v) in &written {
        assert_eq!(get(&s, k).as_deref(), Some(v.as_str()), "{k}");
    }
    put(&s, "after", "restart");
}
