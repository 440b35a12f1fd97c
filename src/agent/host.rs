//! `GET /v1/agent/host`'s facts about the machine, read from `/proc` and
//! `statvfs` in the JSON shapes Consul's (gopsutil's) answer has: Memory,
//! CPU, Host, Disk. A fact that cannot be read is left out and named in
//! `Errors`, as Consul does.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

/// The whole answer, with the disk holding `data_dir`.
pub fn facts(data_dir: &Path) -> Value {
    let mut errors = Vec::new();
    let mut take = |what: &str, r: Result<Value, String>| match r {
        Ok(v) => v,
        Err(e) => {
            errors.push(format!("{what}: {e}"));
            Value::Null
        }
    };
    let memory = take("memory", memory());
    let cpu = take("cpu", cpu());
    let host = take("host", host());
    let disk = take("disk", disk(data_dir));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    json!({
        "Memory": memory,
        "CPU": cpu,
        "Host": host,
        "Disk": disk,
        "CollectionTime": now,
        "Errors": if errors.is_empty() { Value::Null } else { json!(errors) },
    })
}

fn read(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// `/proc/meminfo` in bytes, as gopsutil's `VirtualMemoryStat`.
fn memory() -> Result<Value, String> {
    let m: BTreeMap<String, u64> = read("/proc/meminfo")?
        .lines()
        .filter_map(|l| {
            let (k, rest) = l.split_once(':')?;
            let kb: u64 = rest.split_whitespace().next()?.parse().ok()?;
            Some((k.to_string(), kb * 1024))
        })
        .collect();
    let get = |k: &str| m.get(k).copied().unwrap_or(0);
    let total = get("MemTotal");
    let available = get("MemAvailable");
    let used = total.saturating_sub(available);
    Ok(json!({
        "total": total,
        "available": available,
        "used": used,
        "usedPercent": percent(used, total),
        "free": get("MemFree"),
        "active": get("Active"),
        "inactive": get("Inactive"),
        "buffers": get("Buffers"),
        "cached": get("Cached"),
        "shared": get("Shmem"),
        "slab": get("Slab"),
        "swapTotal": get("SwapTotal"),
        "swapFree": get("SwapFree"),
        "swapCached": get("SwapCached"),
        "dirty": get("Dirty"),
        "writeBack": get("Writeback"),
        "commitLimit": get("CommitLimit"),
        "committedAS": get("Committed_AS"),
        "hugePagesTotal": get("HugePages_Total") / 1024,
        "hugePagesFree": get("HugePages_Free") / 1024,
        "hugePageSize": get("Hugepagesize"),
    }))
}

/// One entry per logical CPU of `/proc/cpuinfo`, as gopsutil's `InfoStat`.
fn cpu() -> Result<Value, String> {
    let text = read("/proc/cpuinfo")?;
    let mut out = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let f: BTreeMap<&str, &str> = block
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim(), v.trim()))
            .collect();
        let num = |k: &str| f.get(k).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
        let cache_kb = f
            .get("cache size")
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(0);
        out.push(json!({
            "cpu": num("processor"),
            "vendorId": f.get("vendor_id").copied().unwrap_or(""),
            "family": f.get("cpu family").copied().unwrap_or(""),
            "model": f.get("model").copied().unwrap_or(""),
            "stepping": num("stepping"),
            "physicalId": f.get("physical id").copied().unwrap_or(""),
            "coreId": f.get("core id").copied().unwrap_or(""),
            "cores": num("cpu cores").max(1),
            "modelName": f.get("model name").copied().unwrap_or(""),
            "mhz": f.get("cpu MHz").and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0),
            "cacheSize": cache_kb,
            "flags": f.get("flags").map(|v| v.split_whitespace().collect::<Vec<_>>()).unwrap_or_default(),
            "microcode": f.get("microcode").copied().unwrap_or(""),
        }));
    }
    Ok(json!(out))
}

/// The host, as gopsutil's `host.InfoStat`.
fn host() -> Result<Value, String> {
    let uptime = read("/proc/uptime")?
        .split_whitespace()
        .next()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(0.0) as u64;
    let boot = read("/proc/stat")?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let procs = std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .bytes()
                        .all(|b| b.is_ascii_digit())
                })
                .count()
        })
        .unwrap_or(0);
    let release: BTreeMap<String, String> = std::fs::read_to_string("/etc/os-release")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
        .collect();
    let trimmed = |p: &str| read(p).map(|s| s.trim().to_string()).unwrap_or_default();
    Ok(json!({
        "hostname": trimmed("/proc/sys/kernel/hostname"),
        "uptime": uptime,
        "bootTime": boot,
        "procs": procs,
        "os": trimmed("/proc/sys/kernel/ostype").to_ascii_lowercase(),
        "platform": release.get("ID").cloned().unwrap_or_default(),
        "platformFamily": release.get("ID_LIKE").cloned().unwrap_or_default(),
        "platformVersion": release.get("VERSION_ID").cloned().unwrap_or_default(),
        "kernelVersion": trimmed("/proc/sys/kernel/osrelease"),
        "kernelArch": std::env::consts::ARCH,
        "virtualizationSystem": "",
        "virtualizationRole": "",
        "hostId": trimmed("/proc/sys/kernel/random/boot_id"),
    }))
}

/// The file system holding `path`, as gopsutil's `disk.UsageStat`. The
/// crate's one unsafe call: libc's `statvfs` (std has none).
#[allow(unsafe_code)]
fn disk(path: &Path) -> Result<Value, String> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: `c` is a valid NUL-terminated path and `st` a zeroed
    // statvfs the call fills in.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(format!(
            "{}: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    let frsize = st.f_frsize as u64;
    let total = st.f_blocks as u64 * frsize;
    let free = st.f_bavail as u64 * frsize;
    let used = (st.f_blocks as u64).saturating_sub(st.f_bfree as u64) * frsize;
    let inodes_total = st.f_files as u64;
    let inodes_free = st.f_ffree as u64;
    let inodes_used = inodes_total.saturating_sub(inodes_free);
    Ok(json!({
        "path": path.display().to_string(),
        "fstype": fstype(path),
        "total": total,
        "free": free,
        "used": used,
        "usedPercent": percent(used, used + free),
        "inodesTotal": inodes_total,
        "inodesUsed": inodes_used,
        "inodesFree": inodes_free,
        "inodesUsedPercent": percent(inodes_used, inodes_total),
    }))
}

/// The type of the longest mount point holding `path`.
fn fstype(path: &Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, at, kind) = (f.next()?, f.next()?, f.next()?);
            path.starts_with(at).then(|| (at.len(), kind.to_string()))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, k)| k)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn facts_of_this_machine() {
        let f = super::facts(std::path::Path::new("/"));
        assert!(f["Errors"].is_null(), "{}", f["Errors"]);
        assert!(f["Memory"]["total"].as_u64().unwrap() > 0);
        assert!(!f["CPU"].as_array().unwrap().is_empty());
        assert!(f["Host"]["uptime"].as_u64().is_some());
        assert!(f["Disk"]["total"].as_u64().unwrap() > 0);
    }
}
