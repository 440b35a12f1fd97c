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
    Server::durable("s1", dir)
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
        .args([
            "--dns-addr",
            &format!("127.0.0.1:{}", common::free_dns_port()),
        ])
        .args(["--grpc-addr", ""])
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

/// `cairn debug data-dir`: whether a start would go ahead, and its report.
fn inspect(dir: &Path) -> (bool, String) {
    let out = Command::new(common::bin())
        .args(["debug", "data-dir"])
        .arg(dir)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// XORs one byte of a file.
fn flip(path: &Path, at: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at as usize] ^= 0x5a;
    std::fs::write(path, bytes).unwrap();
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
    let (ok, report) = inspect(&dir);
    assert!(ok, "{report}");
    flip(&segs[0], sizes[0] / 2);
    // `cairn debug data-dir` sees what a start would refuse.
    let (ok, report) = inspect(&dir);
    assert!(!ok, "{report}");
    let line = report.lines().next().unwrap_or_default();
    assert!(
        line.contains(&segs[0].display().to_string()) && line.contains("REFUSED"),
        "{report}"
    );

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
    let (ok, report) = inspect(&dir);
    assert!(ok && report.contains("would be cut"), "{report}");

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

/// A tmpfs of `size` mounted on a fresh directory, unmounted when dropped;
/// `None` where this machine does not let the tests mount one.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Tmpfs { dir })
    }

    fn resize(&self, size: &str) {
        let st = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.dir.path())
            .status()
            .unwrap();
        assert!(st.success(), "remount");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

#[test]
fn a_full_disk_stops_the_server_and_it_restarts_clean_on_a_good_disk() {
    let Some(disk) = Tmpfs::mount("3m") else {
        eprintln!("SKIPPED: this machine does not allow mounting a tmpfs");
        return;
    };
    let dir = disk.dir.path().join("data");
    let mut s = builder(&dir).start();
    let value = "v".repeat(16 << 10);
    let mut acked = Vec::new();
    let mut failed = 0;
    for i in 0.. {
        let key = format!("fill/{i:05}");
        match common::try_request(s.http_addr, "PUT", &format!("/v1/kv/{key}"), Some(&value)) {
            Ok(r) if r.status == 200 => acked.push(key),
            // Refused, or the server is gone: the disk is full.
            _ => failed += 1,
        }
        if failed > 0 && !s.is_running() {
            break;
        }
        assert!(i < 2000, "the server kept running on a full disk");
    }
    let status = s.stop(Duration::from_secs(10)).expect("exited");
    let log = s.log();
    assert_eq!(status.code(), Some(74), "{status}:\n{log}");
    let fault = log
        .lines()
        .find(|l| l.contains("storage fault, stopping"))
        .unwrap_or_else(|| panic!("no fault line:\n{log}"));
    assert!(
        fault.contains(&dir.display().to_string()) && fault.contains("No space left"),
        "the reason names no file or error: {fault}"
    );
    assert!(!acked.is_empty());
    eprintln!("{fault}");

    // The same data dir on a disk with room: it starts, and every write
    // acknowledged before the fault is there.
    disk.resize("64m");
    let s = builder(&dir).start();
    // sled, failing in the middle of a write, was seen to keep a later
    // batch and lose an earlier row: after a storage fault the rows are
    // rebuilt from the snapshot and the log, never trusted.
    assert!(
        s.log().contains("not vouched for"),
        "the rows were trusted after a storage fault:\n{}",
        s.log()
    );
    for k in &acked {
        assert_eq!(get(&s, k).as_deref(), Some(value.as_str()), "{k}");
    }
    put(&s, "after", "restart");
}

/// Sets the format version of the sled state rows (as another cairn
/// version would have written it).
fn set_state_format(dir: &Path, version: u32) {
    let db = sled::open(dir.join("db")).unwrap();
    let name = db
        .open_tree("server")
        .unwrap()
        .get("state_tree")
        .unwrap()
        .map(|n| n.to_vec())
        .unwrap_or(b"state".to_vec());
    db.open_tree(name)
        .unwrap()
        .insert("mformat", &version.to_be_bytes())
        .unwrap();
    db.flush().unwrap();
}

/// Writes `version` at `at` in `path`, returning what was there.
fn set_u32(path: &Path, at: u64, version: u32) -> [u8; 4] {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut old = [0u8; 4];
    f.read_exact_at(&mut old, at).unwrap();
    f.write_all_at(&version.to_le_bytes(), at).unwrap();
    old
}

#[test]
fn an_unknown_format_version_refuses_to_start_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    {
        // Snapshots every few entries, so there is a snapshot file.
        let mut s = builder(&dir)
            .arg("--raft-snapshot-threshold")
            .arg("8")
            .start();
        for i in 0..30 {
            put(&s, &format!("k/{i}"), "v");
        }
        common::eventually(Duration::from_secs(20), "a snapshot file", || {
            dir.join("snapshots/snapshot.bin").exists().then_some(())
        });
        s.stop(Duration::from_secs(10));
    }
    let refused = |what: &str, file: &Path| {
        let (status, stderr) = run_until_exit(&dir, Duration::from_secs(30));
        let status = status.unwrap_or_else(|| panic!("{what}: started anyway:\n{stderr}"));
        assert!(!status.success(), "{what}: {status}");
        let file = file.display().to_string();
        assert!(
            stderr.contains(&file) && stderr.contains("format version 99"),
            "{what}: stderr does not name {file} and its version:\n{stderr}"
        );
    };

    let seg = segments(&dir).pop().unwrap();
    let old = set_u32(&seg, 8, 99);
    refused("log segment", &seg);
    set_u32(&seg, 8, u32::from_le_bytes(old));

    let snap = dir.join("snapshots/snapshot.bin");
    let old = set_u32(&snap, 8, 99);
    refused("snapshot", &snap);
    set_u32(&snap, 8, u32::from_le_bytes(old));

    set_state_format(&dir, 99);
    refused("state rows", &dir.join("db"));
    set_state_format(&dir, cairn::disk::STATE_FORMAT);

    // Put back as they were, the files start a server with every key.
    let s = builder(&dir).start();
    for i in 0..30 {
        assert_eq!(get(&s, &format!("k/{i}")).as_deref(), Some("v"));
    }
}

/// The state's rows are written behind (`state::write_behind`): a crash
/// right after acknowledged writes finds them missing from the rows, and
/// the restart re-applies them from the Raft log.
#[test]
fn a_crash_right_after_acknowledged_writes_loses_none_of_them() {
    let tmp = tempfile::tempdir().unwrap();
    let mut s = Server::durable("s1", tmp.path().join("data")).start();
    let written: Vec<(String, String)> = (0..300)
        .map(|i| (format!("crash/{i:04}"), format!("v{i}")))
        .collect();
    for (k, v) in &written {
        put(&s, k, v);
    }
    // SIGKILL at once, then the same data dir again.
    s.restart();
    for (k, v) in &written {
        assert_eq!(get(&s, k).as_deref(), Some(v.as_str()), "{k}");
    }
    put(&s, "after", "restart");
}

/// A start that finds its rows untrusted installs the saved snapshot, whose
/// rows are written behind (`state::write_behind`) before the writes after
/// it: stopped, the next start finds them all in its rows; killed right
/// after a write, the next start still has every key, from the rows or,
/// again, from the snapshot and the log.
#[test]
fn rows_rebuilt_from_the_snapshot_are_written_and_survive_a_crash() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let durable = || {
        Server::durable("s1", &dir)
            .arg("--raft-snapshot-threshold")
            .arg("50")
    };
    let mut s = durable().start();
    let written: Vec<(String, String)> = (0..300)
        .map(|i| (format!("snap/{i:03}"), format!("v{i}")))
        .collect();
    for (k, v) in &written {
        put(&s, k, v);
    }
    let snapshot = dir.join("snapshots/snapshot.bin");
    common::eventually(Duration::from_secs(20), "a snapshot", || {
        snapshot.exists().then_some(())
    });
    assert!(s.stop(Duration::from_secs(10)).is_some_and(|e| e.success()));
    std::fs::remove_file(dir.join("state-rows-ok")).unwrap();
    let mut s = durable().start();
    assert!(
        s.log().contains("not vouched for") && s.log().contains("installed snapshot"),
        "the start did not rebuild the rows from the snapshot:\n{}",
        s.log()
    );
    put(&s, "after", "install");
    let all = |s: &Server| {
        for (k, v) in &written {
            assert_eq!(get(s, k).as_deref(), Some(v.as_str()), "{k}");
        }
        assert_eq!(get(s, "after").as_deref(), Some("install"));
    };
    assert!(s.stop(Duration::from_secs(10)).is_some_and(|e| e.success()));
    let mut s = durable().start();
    assert!(
        !s.log().contains("installed snapshot"),
        "the stop left rows behind the snapshot:\n{}",
        s.log()
    );
    all(&s);
    put(&s, "after", "install");
    s.restart();
    all(&s);
}
