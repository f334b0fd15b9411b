//! save / load of the shared histories (a warm start). Prompts of live requests are not saved.
//!
//! Format, little-endian, version 3:
//! ```text
//! magic  b"LKAHSAV3"  | version u32 | max_depth u32 | capacity_nodes u64
//! prompt_weight f64   | output_weight f64 | keep_prompt_as_history u8 | background_indexing u8
//! history_skip lo u32 | hi u32 (0, 0: none)
//! namespaces u32, then per namespace:
//!   name_len u32 | name (UTF-8) | nodes u64 | nodes x (parent u32, token u32, count u32)
//! b"END!" | file_len u64 (of the whole file) | checksum u64
//! ```
//! The checksum is FNV-1a 64 over every byte before it. Each step of FNV-1a is a bijection
//! of the state, so any change confined to one byte always changes it; other damage goes
//! unnoticed with probability about 2^-64 (it guards against corruption, not an attacker).
//! A file is refused unless its checksum, its length field and its actual length agree,
//! with nothing after the checksum.
//!
//! Versions 1 and 2 (magic b"LKAHTRIE", no checksum; version 1 had no `history_skip`, so
//! it loads with None) still load, with the same structural checks and no trailing bytes.
//! Their magic differs from version 3's in four bytes, so no single damaged byte turns a
//! version 3 file into one that skips the checksum.
//! Nodes are in breadth-first order and numbered from 1 in file order (0 is the root), so a
//! parent always comes before its children. Each namespace is a consistent snapshot (taken
//! under its read lock); namespaces are saved one after another.
//!
//! Writes are atomic and durable: a temporary file beside the target, fsynced, renamed over
//! it, then the folder fsynced. Saving onto a symbolic link writes through it (the link's
//! target is replaced, the link stays). Temporary files of saves killed mid-write are
//! removed by the next save to the same path once over an hour old (a younger one may be
//! another host's or container's save in progress).

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::arena::NONE;
use crate::cache::{Cache, Config, MAX_INDEX_THREADS, MAX_NAMESPACE_BYTES};
use crate::error::{Error, Result};
use crate::trie::{Trie, ROOT};

const MAGIC: &[u8; 8] = b"LKAHSAV3";
/// Magic of versions 1 and 2.
const LEGACY_MAGIC: &[u8; 8] = b"LKAHTRIE";
const END: &[u8; 4] = b"END!";
pub const VERSION: u32 = 3;
/// Nodes a file's count may reserve room for before they are read (a hostile count must not
/// allocate before the file proves it holds them).
const PREALLOC_NODES: u64 = 1 << 16;
/// Marks this crate's temporary files (`<name>.<pid>.<n>.tmp-lookahead`).
const TMP_SUFFIX: &str = ".tmp-lookahead";

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(FNV_PRIME);
    }
    h
}

/// A writer that checksums and counts what passes through it.
struct Summing<W: Write> {
    w: W,
    hash: u64,
    len: u64,
}

impl<W: Write> Write for Summing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.w.write(buf)?;
        self.hash = fnv1a(self.hash, &buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.w.flush()
    }
}

/// The path a save really writes: a symbolic link's target (written through, created if
/// the link dangles), following chains of links up to 40 deep as the OS does.
fn resolve(path: &Path) -> Result<PathBuf> {
    let mut p = path.to_owned();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let to =
                    std::fs::read_link(&p).map_err(|e| Error::io("follow the link", &p, &e))?;
                p = match p.parent() {
                    Some(dir) if to.is_relative() => dir.join(to),
                    _ => to,
                };
            }
            _ => return Ok(p),
        }
    }
    Err(Error::Io(format!(
        "cannot save to {}: too many levels of symbolic links",
        path.display()
    )))
}

/// A temporary file beside `path`, unique to this save: concurrent saves (to one path, or to
/// `h.bin` and `h.dat`) never write into each other's file.
fn temp_beside(path: &Path) -> Result<PathBuf> {
    static SAVES: AtomicU64 = AtomicU64::new(0);
    let mut name = path
        .file_name()
        .ok_or_else(|| Error::InvalidInput(format!("{} names no file", path.display())))?
        .to_owned();
    let n = SAVES.fetch_add(1, Ordering::Relaxed);
    name.push(format!(".{}.{n}{TMP_SUFFIX}", std::process::id()));
    Ok(path.with_file_name(name))
}

/// A temporary file younger than this is never removed as stale: its pid may belong to
/// another PID namespace or host (a container, a shared folder), where /proc cannot see it.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(3600);

/// Removes temporary files of earlier saves to `path` whose process is gone (killed
/// mid-write) and that are over an hour old. Only where /proc tells which processes live;
/// elsewhere they stay.
fn remove_stale_temps(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return;
    };
    if !Path::new("/proc/self").exists() {
        return;
    }
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let prefix = format!("{}.", name.to_string_lossy());
    for entry in entries.flatten() {
        let file = entry.file_name();
        let file = file.to_string_lossy();
        let Some(rest) = file
            .strip_prefix(&prefix)
            .and_then(|r| r.strip_suffix(TMP_SUFFIX))
        else {
            continue;
        };
        let Some((pid, n)) = rest.split_once('.') else {
            continue;
        };
        let ours = pid.parse::<u32>().is_ok() && n.parse::<u64>().is_ok();
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= STALE_AFTER);
        if ours && old && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Writes the configuration and every namespace's history to `path`, through a temporary
/// file renamed over it once complete and on disk (a reader never sees a partial file, a
/// crash leaves the old file or the new one).
pub fn save(cache: &Cache, path: &Path) -> Result<()> {
    let path = resolve(path)?;
    remove_stale_temps(&path);
    let tmp = temp_beside(&path)?;
    let written = write_to(cache, &tmp)
        .and_then(|()| std::fs::rename(&tmp, &path).map_err(|e| Error::io("replace", &path, &e)));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    // The rename is durable once the folder is on disk too.
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io("sync (the file is replaced) the folder of", &path, &e))?;
    Ok(())
}

fn write_to(cache: &Cache, tmp: &Path) -> Result<()> {
    let err = |e: std::io::Error| Error::io("write", tmp, &e);
    let file = File::create(tmp).map_err(err)?;
    let mut w = Summing {
        w: BufWriter::new(file),
        hash: FNV_OFFSET,
        len: 0,
    };
    write_body(cache, &mut w).map_err(err)?;
    let len = w.len + 16;
    w.write_all(&len.to_le_bytes()).map_err(err)?;
    let hash = w.hash;
    w.write_all(&hash.to_le_bytes()).map_err(err)?;
    let file = w.w.into_inner().map_err(|e| err(e.into_error()))?;
    file.sync_all().map_err(err)
}

fn write_body(cache: &Cache, w: &mut impl Write) -> std::io::Result<()> {
    let c = cache.config();
    w.write_all(MAGIC)?;
    w.write_all(&VERSION.to_le_bytes())?;
    w.write_all(&(c.max_depth as u32).to_le_bytes())?;
    w.write_all(&c.capacity_nodes.to_le_bytes())?;
    w.write_all(&c.prompt_weight.to_le_bytes())?;
    w.write_all(&c.output_weight.to_le_bytes())?;
    w.write_all(&[
        u8::from(c.keep_prompt_as_history),
        u8::from(c.background_indexing),
    ])?;
    let (lo, hi) = c.history_skip.unwrap_or((0, 0));
    w.write_all(&(lo as u32).to_le_bytes())?;
    w.write_all(&(hi as u32).to_le_bytes())?;
    let all = cache.namespaces();
    w.write_all(&(all.len() as u32).to_le_bytes())?;
    for ns in all {
        let h = ns.history.read().unwrap_or_else(|e| e.into_inner());
        w.write_all(&(ns.name.len() as u32).to_le_bytes())?;
        w.write_all(ns.name.as_bytes())?;
        w.write_all(&h.nodes().to_le_bytes())?;
        // Breadth-first; `queue[i]` is the arena index of file node i (0: root).
        let mut queue = vec![ROOT];
        let mut i = 0;
        while i < queue.len() {
            let n = queue[i];
            for (tok, c) in h.children(n) {
                w.write_all(&(i as u32).to_le_bytes())?;
                w.write_all(&tok.to_le_bytes())?;
                w.write_all(&h.node(c).count.to_le_bytes())?;
                queue.push(c);
            }
            i += 1;
        }
    }
    w.write_all(END)?;
    w.flush()
}

/// Reads a save file, checksumming and counting what it reads.
struct Reader<'p, R: Read> {
    r: R,
    path: &'p Path,
    hash: u64,
    len: u64,
}

impl<R: Read> Reader<'_, R> {
    fn fill(&mut self, b: &mut [u8]) -> Result<()> {
        self.r.read_exact(b).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                self.damaged("it is truncated")
            } else {
                Error::io("read", self.path, &e)
            }
        })?;
        self.hash = fnv1a(self.hash, b);
        self.len += b.len() as u64;
        Ok(())
    }
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.fill(&mut b)?;
        Ok(b)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }
    fn f64(&mut self) -> Result<f64> {
        Ok(f64::from_le_bytes(self.bytes()?))
    }
    /// A format error naming the file.
    fn damaged(&self, why: &str) -> Error {
        Error::Format(format!(
            "{} is not a valid lookahead save file: {why}",
            self.path.display()
        ))
    }
    /// Whether the file ends here.
    fn at_end(&mut self) -> Result<bool> {
        let mut b = [0u8; 1];
        loop {
            match self.r.read(&mut b) {
                Ok(n) => return Ok(n == 0),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::io("read", self.path, &e)),
            }
        }
    }
}

/// A new cache with the saved configuration and histories. `background_indexing`
/// overrides the saved setting when given; `index_threads` is not saved (it belongs to the
/// machine, not the data): `None` is 0, as many as the cores allow.
pub fn load(
    path: &Path,
    background_indexing: Option<bool>,
    index_threads: Option<usize>,
) -> Result<Cache> {
    if let Some(n) = index_threads.filter(|&n| n > MAX_INDEX_THREADS) {
        return Err(Error::InvalidInput(format!(
            "index_threads must be in 0..={MAX_INDEX_THREADS}, got {n}"
        )));
    }
    let file = File::open(path).map_err(|e| Error::io("open", path, &e))?;
    let meta = file.metadata().map_err(|e| Error::io("open", path, &e))?;
    if meta.is_dir() {
        return Err(Error::Io(format!(
            "cannot load {}: it is a directory",
            path.display()
        )));
    }
    let mut r = Reader {
        r: BufReader::new(file),
        path,
        hash: FNV_OFFSET,
        len: 0,
    };
    let (cache, version) = read_body(&mut r, background_indexing, index_threads)?;
    if version >= 3 {
        let len = r.len + 16;
        let want_len = r.u64()?;
        let hash = r.hash;
        let want_hash = r.u64()?;
        if want_len != len || want_hash != hash {
            return Err(r.damaged("its checksum or length does not match its contents"));
        }
    }
    if !r.at_end()? {
        return Err(r.damaged("bytes follow its end"));
    }
    Ok(cache)
}

/// The cache a file's body describes, and the file's version.
fn read_body<R: Read>(
    r: &mut Reader<'_, R>,
    background_indexing: Option<bool>,
    index_threads: Option<usize>,
) -> Result<(Cache, u32)> {
    let magic = r.bytes::<8>()?;
    let version = r.u32()?;
    let known = match &magic {
        m if m == MAGIC => version == VERSION,
        m if m == LEGACY_MAGIC => (1..VERSION).contains(&version),
        _ => return Err(r.damaged("no lookahead save file magic")),
    };
    if !known {
        return Err(r.damaged(&format!(
            "version {version} under magic {:?}; this build reads versions 1 to {VERSION}",
            String::from_utf8_lossy(&magic)
        )));
    }
    let max_depth = r.u32()? as usize;
    let capacity_nodes = r.u64()?;
    let prompt_weight = r.f64()?;
    let output_weight = r.f64()?;
    let [keep, bg] = r.bytes::<2>()?;
    if keep > 1 || bg > 1 {
        return Err(r.damaged("a flag byte is neither 0 nor 1"));
    }
    let history_skip = if version >= 2 {
        match (r.u32()? as usize, r.u32()? as usize) {
            (0, 0) => None,
            skip => Some(skip),
        }
    } else {
        None
    };
    let cfg = Config {
        max_depth,
        capacity_nodes,
        prompt_weight,
        output_weight,
        keep_prompt_as_history: keep != 0,
        background_indexing: background_indexing.unwrap_or(bg != 0),
        index_threads: index_threads.unwrap_or(0),
        history_skip,
        // Recycled predictions are not saved: a loaded cache keeps none.
        ..Config::default()
    };
    let cache = Cache::new(cfg).map_err(|e| match e {
        Error::InvalidInput(m) => r.damaged(&format!("it holds a bad configuration: {m}")),
        other => other,
    })?;
    let n_ns = r.u32()?;
    let mut names = HashSet::new();
    for _ in 0..n_ns {
        let len = r.u32()? as usize;
        if len > MAX_NAMESPACE_BYTES {
            return Err(r.damaged(&format!("a namespace name of {len} bytes")));
        }
        let mut name = vec![0u8; len];
        r.fill(&mut name)?;
        let name =
            String::from_utf8(name).map_err(|_| r.damaged("a namespace name is not UTF-8"))?;
        if !names.insert(name.clone()) {
            return Err(r.damaged(&format!("namespace {name:?} appears twice")));
        }
        let n = r.u64()?;
        let got = cache.budget().reserve_up_to(n);
        if got < n {
            cache.budget().release(got);
            return Err(r.damaged(&format!(
                "namespace {name:?} holds {n} nodes, more than the capacity left"
            )));
        }
        let mut t = Trie::new();
        t.allowance = n;
        // `index[i]`: the arena index of file node i; `depth[i]`: its n-gram's length.
        let mut index = Vec::with_capacity(n.min(PREALLOC_NODES) as usize + 1);
        let mut depth: Vec<u8> = Vec::with_capacity(index.capacity());
        index.push(ROOT);
        depth.push(0);
        for _ in 0..n {
            let node = (|| Ok((r.u32()? as usize, r.u32()?, r.u32()?)))();
            let bad = match node {
                Err(e) => Some(e),
                Ok((parent, token, count)) => match index.get(parent).zip(depth.get(parent)) {
                    None => Some(r.damaged(&format!(
                        "node {} names parent {parent}, not yet read",
                        index.len()
                    ))),
                    Some((_, &d)) if usize::from(d) >= max_depth => Some(r.damaged(&format!(
                        "node {} is deeper than max_depth {max_depth}",
                        index.len()
                    ))),
                    Some((&p, &d)) => {
                        let before = t.nodes();
                        let c = t.child_or_insert(p, token);
                        if c == NONE || t.nodes() == before {
                            Some(r.damaged(&format!(
                                "duplicate child {token} under file node {parent}"
                            )))
                        } else {
                            t.bump(c, count);
                            index.push(c);
                            depth.push(d + 1);
                            None
                        }
                    }
                },
            };
            if let Some(e) = bad {
                cache.budget().release(t.nodes() + t.allowance);
                return Err(e);
            }
        }
        t.compute_links();
        cache.install_history(&name, t);
    }
    if &r.bytes::<4>()? != END {
        return Err(r.damaged("its end marker is missing"));
    }
    Ok((cache, version))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::RequestId;

    #[test]
    fn save_load_round_trip() {
        let cfg = Config {
            max_depth: 5,
            capacity_nodes: 100_000,
            background_indexing: false,
            history_skip: Some((2, 3)),
            ..Config::default()
        };
        let c = Cache::new(cfg).unwrap();
        c.add_history(&[(0..300).map(|i| i % 17).collect()], "default")
            .unwrap();
        c.add_history(&[vec![4, 5, 6, 4, 5, 7]], "tenant-b")
            .unwrap();
        let dir = std::env::temp_dir().join(format!("lookahead-persist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("h.bin");
        save(&c, &path).unwrap();
        let d = load(&path, None, None).unwrap();
        d.check_invariants().unwrap();
        assert_eq!(d.config(), c.config());
        assert_eq!(d.stats().nodes, c.stats().nodes);
        for (a, b) in c.namespaces().iter().zip(d.namespaces().iter()) {
            let mut x = a.history.read().unwrap().ngrams();
            let mut y = b.history.read().unwrap().ngrams();
            x.sort();
            y.sort();
            assert_eq!((&a.name, x), (&b.name, y));
        }
        let rid = RequestId::Int(1);
        d.start_request(rid.clone(), vec![4, 5], "tenant-b")
            .unwrap();
        assert_eq!(d.draft(&rid, 1, true).unwrap().tokens.len(), 2);
        std::fs::write(&path, b"LKAHTRIE\x01\x00").unwrap();
        assert_eq!(load(&path, None, None).err().unwrap().kind(), "Format");
        // Version 1 had no history_skip: it loads with none (what its drafts did).
        let mut v1 = Vec::new();
        v1.extend_from_slice(LEGACY_MAGIC);
        v1.extend_from_slice(&1u32.to_le_bytes());
        v1.extend_from_slice(&6u32.to_le_bytes());
        v1.extend_from_slice(&1000u64.to_le_bytes());
        v1.extend_from_slice(&4f64.to_le_bytes());
        v1.extend_from_slice(&1f64.to_le_bytes());
        v1.extend_from_slice(&[0, 0]);
        v1.extend_from_slice(&0u32.to_le_bytes());
        v1.extend_from_slice(END);
        std::fs::write(&path, &v1).unwrap();
        let old = load(&path, None, None).unwrap();
        assert_eq!(
            (old.config().max_depth, old.config().history_skip),
            (6, None)
        );
        std::fs::write(&path, [&v1[..8], &9u32.to_le_bytes(), &v1[12..]].concat()).unwrap();
        assert_eq!(load(&path, None, None).err().unwrap().kind(), "Format");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A version 2 header (no checksum: the structural checks below must hold alone).
    fn header(capacity: u64, depth: u32) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(LEGACY_MAGIC);
        v.extend_from_slice(&2u32.to_le_bytes());
        v.extend_from_slice(&depth.to_le_bytes());
        v.extend_from_slice(&capacity.to_le_bytes());
        v.extend_from_slice(&4f64.to_le_bytes());
        v.extend_from_slice(&1f64.to_le_bytes());
        v.extend_from_slice(&[0, 0]);
        v.extend_from_slice(&3u32.to_le_bytes());
        v.extend_from_slice(&6u32.to_le_bytes());
        v
    }

    fn namespace(v: &mut Vec<u8>, name: &str, count: u64, nodes: &[(u32, u32, u32)]) {
        v.extend_from_slice(&(name.len() as u32).to_le_bytes());
        v.extend_from_slice(name.as_bytes());
        v.extend_from_slice(&count.to_le_bytes());
        for &(p, t, c) in nodes {
            for x in [p, t, c] {
                v.extend_from_slice(&x.to_le_bytes());
            }
        }
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("lookahead-persist-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn load_bytes(name: &str, bytes: &[u8]) -> Result<Cache> {
        let dir = scratch(name);
        let path = dir.join("f.bin");
        std::fs::write(&path, bytes).unwrap();
        let r = load(&path, Some(false), None);
        std::fs::remove_dir_all(&dir).unwrap();
        r
    }

    /// Hostile files fail with a format error: a huge node count in a tiny file (no
    /// up-front allocation of it), a namespace named twice (its first trie's budget would
    /// leak), a node deeper than max_depth.
    #[test]
    fn hostile_files_are_refused() {
        let cap = u64::from(u32::MAX - 2);
        let mut v = header(cap, 4);
        v.extend_from_slice(&1u32.to_le_bytes());
        namespace(&mut v, "default", cap, &[]);
        assert_eq!(load_bytes("huge", &v).err().unwrap().kind(), "Format");

        let mut v = header(1000, 4);
        v.extend_from_slice(&2u32.to_le_bytes());
        namespace(&mut v, "default", 3, &[(0, 1, 1), (0, 2, 1), (1, 2, 1)]);
        namespace(&mut v, "default", 1, &[(0, 7, 1)]);
        v.extend_from_slice(END);
        let e = load_bytes("dup", &v).err().unwrap();
        assert_eq!(e.kind(), "Format");
        assert!(e.to_string().contains("appears twice"), "{e}");

        let mut v = header(1000, 2);
        v.extend_from_slice(&1u32.to_le_bytes());
        namespace(&mut v, "default", 3, &[(0, 1, 1), (1, 2, 1), (2, 3, 1)]);
        v.extend_from_slice(END);
        let e = load_bytes("deep", &v).err().unwrap();
        assert!(e.to_string().contains("deeper than max_depth"), "{e}");
    }

    /// A count saved at u32::MAX stays there when counted again, and its parent's side table
    /// keeps summing its children's counts exactly.
    #[test]
    fn saturated_counts_keep_side_sums_exact() {
        let mut nodes: Vec<(u32, u32, u32)> = (0..10).map(|t| (0, t, 1)).collect();
        nodes[0].2 = u32::MAX;
        let mut v = header(1000, 4);
        v.extend_from_slice(&1u32.to_le_bytes());
        namespace(&mut v, "default", nodes.len() as u64, &nodes);
        v.extend_from_slice(END);
        let c = load_bytes("saturated", &v).unwrap();
        c.check_invariants().unwrap();
        let rid = RequestId::Int(1);
        c.start_request(rid.clone(), vec![5], "default").unwrap();
        c.extend(&rid, &[0, 0]).unwrap();
        c.check_invariants().unwrap();
    }

    fn saved_file(name: &str) -> (std::path::PathBuf, Vec<u8>) {
        let cfg = Config {
            max_depth: 6,
            capacity_nodes: 100_000,
            background_indexing: false,
            ..Config::default()
        };
        let c = Cache::new(cfg).unwrap();
        c.add_history(&[(0..400).map(|i| i * 7 % 61).collect()], "default")
            .unwrap();
        c.add_history(&[vec![4, 5, 6, 4, 5, 7]], "b").unwrap();
        let dir = scratch(name);
        let path = dir.join("h.bin");
        save(&c, &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        (dir, bytes)
    }

    /// Any damaged byte, anywhere (header, body, end marker, length, checksum), and any
    /// bytes after the end are refused as a format error that names the file.
    #[test]
    fn every_damaged_file_is_refused() {
        let (dir, good) = saved_file("flips");
        let path = dir.join("d.bin");
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..1000 {
            x ^= x << 7;
            x ^= x >> 9;
            let mut bad = good.clone();
            let at = (x as usize) % bad.len();
            // The first 120 flips cover the header and the trailer byte by byte.
            let at = if i < 120 {
                if i < 60 {
                    i
                } else {
                    bad.len() - (i - 59)
                }
            } else {
                at
            };
            bad[at] ^= ((x >> 32) as u8) | 1;
            std::fs::write(&path, &bad).unwrap();
            let e = load(&path, Some(false), None).err();
            let e = e.unwrap_or_else(|| panic!("flip at byte {at} of {} loaded", bad.len()));
            assert_eq!(e.kind(), "Format", "flip at {at}: {e}");
            assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        }
        for tail in [&b"x"[..], &good[..]] {
            std::fs::write(&path, [&good[..], tail].concat()).unwrap();
            let e = load(&path, Some(false), None).err().unwrap();
            assert!(e.to_string().contains("bytes follow its end"), "{e}");
        }
        std::fs::write(&path, &good[..good.len() - 1]).unwrap();
        let e = load(&path, Some(false), None).err().unwrap();
        assert!(e.to_string().contains("truncated"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn io_errors_name_the_path_and_the_errno() {
        let dir = scratch("io");
        let missing = dir.join("missing.bin");
        let e = load(&missing, None, None).err().unwrap();
        assert_eq!(e.kind(), "NotFound");
        assert!(e.to_string().contains("missing.bin") && e.to_string().contains("os error 2"));
        let e = load(&dir, None, None).err().unwrap();
        assert_eq!(e.kind(), "Io");
        assert!(e.to_string().contains("directory"), "{e}");
        let c = Cache::new(Config::default()).unwrap();
        let e = save(&c, &dir.join("no/such/folder/h.bin")).err().unwrap();
        assert!(e.to_string().contains("no/such/folder"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A save killed mid-write leaves its temporary file; the next save to that path
    /// removes it (but not one of a live process: a save in progress). A symbolic link is
    /// written through: the link stays, its target gets the new file.
    #[test]
    fn stale_temporaries_go_and_links_are_written_through() {
        let (dir, good) = saved_file("stale");
        let path = dir.join("h.bin");
        let dead = dir.join(format!("h.bin.{}.0{TMP_SUFFIX}", u32::MAX - 7));
        let live = dir.join(format!("h.bin.{}.99{TMP_SUFFIX}", std::process::id()));
        let other = dir.join(format!("g.bin.{}.0{TMP_SUFFIX}", u32::MAX - 7));
        let young = dir.join(format!("h.bin.{}.1{TMP_SUFFIX}", u32::MAX - 7));
        for f in [&dead, &live, &other, &young] {
            std::fs::write(f, b"partial").unwrap();
        }
        let hours_ago = std::time::SystemTime::now() - 2 * STALE_AFTER;
        for f in [&dead, &live, &other] {
            File::options()
                .write(true)
                .open(f)
                .unwrap()
                .set_modified(hours_ago)
                .unwrap();
        }
        let c = load(&path, Some(false), None).unwrap();
        save(&c, &path).unwrap();
        assert!(!dead.exists() && live.exists() && other.exists() && young.exists());
        let nodes = |p: &Path| load(p, Some(false), None).unwrap().stats().history_nodes;
        assert_eq!(nodes(&path), c.stats().history_nodes);
        assert!(good.len() > 100);

        let target = dir.join("target.bin");
        let link = dir.join("link.bin");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        save(&c, &link).unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(nodes(&target), c.stats().history_nodes);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Saves running at once, to one path or to two sharing a stem, each write a whole
    /// file of their own cache (each save has its own temporary file).
    #[test]
    fn concurrent_saves_do_not_mix() {
        let cache = |tok: u32, n: u32| {
            let cfg = Config {
                max_depth: 4,
                capacity_nodes: 1 << 20,
                background_indexing: false,
                ..Config::default()
            };
            let c = Cache::new(cfg).unwrap();
            let text = (0..n)
                .map(|i| tok + i.wrapping_mul(2_654_435_761) % 50_000)
                .collect();
            c.add_history(&[text], "default").unwrap();
            std::sync::Arc::new(c)
        };
        let (a, b) = (cache(0, 40_000), cache(1_000_000, 30_000));
        let dir = scratch("concurrent");
        let (pa, pb) = (dir.join("h.bin"), dir.join("h.dat"));
        for _ in 0..4 {
            let jobs = [(&a, &pa), (&b, &pb), (&a, &pa)].map(|(c, p)| {
                let (c, p) = (std::sync::Arc::clone(c), p.clone());
                std::thread::spawn(move || save(&c, &p))
            });
            for j in jobs {
                j.join().unwrap().unwrap();
            }
            for (c, p) in [(&a, &pa), (&b, &pb)] {
                let want = c.stats().history_nodes;
                assert_eq!(
                    load(p, Some(false), None).unwrap().stats().history_nodes,
                    want
                );
            }
        }
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 2, "temporary files left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
