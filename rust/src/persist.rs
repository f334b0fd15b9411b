//! save / load of the shared histories (a warm start). Prompts of live requests are not saved.
//!
//! Format, little-endian, version 2:
//! ```text
//! magic  b"LKAHTRIE"  | version u32 | max_depth u32 | capacity_nodes u64
//! prompt_weight f64   | output_weight f64 | keep_prompt_as_history u8 | background_indexing u8
//! history_skip lo u32 | hi u32 (0, 0: none)
//! namespaces u32, then per namespace:
//!   name_len u32 | name (UTF-8) | nodes u64 | nodes x (parent u32, token u32, count u32)
//! b"END!"
//! ```
//! Version 1 (no `history_skip`; its drafts consulted the history at every length) loads
//! with `history_skip` None.
//! Nodes are in breadth-first order and numbered from 1 in file order (0 is the root), so a
//! parent always comes before its children. Each namespace is a consistent snapshot (taken
//! under its read lock); namespaces are saved one after another.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::arena::NONE;
use crate::cache::{Cache, Config, MAX_INDEX_THREADS, MAX_NAMESPACE_BYTES};
use crate::error::{Error, Result};
use crate::trie::{Trie, ROOT};

const MAGIC: &[u8; 8] = b"LKAHTRIE";
const END: &[u8; 4] = b"END!";
pub const VERSION: u32 = 2;
/// Nodes a file's count may reserve room for before they are read (a hostile count must not
/// allocate before the file proves it holds them).
const PREALLOC_NODES: u64 = 1 << 16;

/// A temporary file beside `path`, unique to this save: concurrent saves (to one path, or to
/// `h.bin` and `h.dat`) never write into each other's file.
fn temp_beside(path: &Path) -> Result<PathBuf> {
    static SAVES: AtomicU64 = AtomicU64::new(0);
    let mut name = path
        .file_name()
        .ok_or_else(|| Error::InvalidInput(format!("{} names no file", path.display())))?
        .to_owned();
    let n = SAVES.fetch_add(1, Ordering::Relaxed);
    name.push(format!(".{}.{n}.tmp-lookahead", std::process::id()));
    Ok(path.with_file_name(name))
}

/// Writes the configuration and every namespace's history to `path`, through a temporary
/// file renamed over it once complete (a reader never sees a partial file).
pub fn save(cache: &Cache, path: &Path) -> Result<()> {
    let tmp = temp_beside(path)?;
    let written = write_to(cache, &tmp).and_then(|()| Ok(std::fs::rename(&tmp, path)?));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

fn write_to(cache: &Cache, tmp: &Path) -> Result<()> {
    {
        let mut w = BufWriter::new(File::create(tmp)?);
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
        w.flush()?;
    }
    Ok(())
}

struct Reader<R: Read>(R);

impl<R: Read> Reader<R> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.0
            .read_exact(&mut b)
            .map_err(|e| Error::Format(format!("save file is truncated or unreadable: {e}")))?;
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
    let mut r = Reader(BufReader::new(File::open(path)?));
    let fmt = |m: String| Error::Format(m);
    if &r.bytes::<8>()? != MAGIC {
        return Err(fmt(format!(
            "{} is not a lookahead save file",
            path.display()
        )));
    }
    let version = r.u32()?;
    if !(1..=VERSION).contains(&version) {
        return Err(fmt(format!(
            "save file version {version}, this build reads 1 to {VERSION}"
        )));
    }
    let max_depth = r.u32()? as usize;
    let capacity_nodes = r.u64()?;
    let prompt_weight = r.f64()?;
    let output_weight = r.f64()?;
    let [keep, bg] = r.bytes::<2>()?;
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
    };
    let cache =
        Cache::new(cfg).map_err(|e| fmt(format!("save file holds a bad configuration: {e}")))?;
    let n_ns = r.u32()?;
    let mut names = HashSet::new();
    for _ in 0..n_ns {
        let len = r.u32()? as usize;
        if len > MAX_NAMESPACE_BYTES {
            return Err(fmt(format!("namespace name of {len} bytes")));
        }
        let mut name = vec![0u8; len];
        r.0.read_exact(&mut name)
            .map_err(|e| fmt(format!("save file is truncated: {e}")))?;
        let name =
            String::from_utf8(name).map_err(|_| fmt("namespace name is not UTF-8".into()))?;
        if !names.insert(name.clone()) {
            return Err(fmt(format!("namespace {name:?} appears twice")));
        }
        let n = r.u64()?;
        let got = cache.budget().reserve_up_to(n);
        if got < n {
            cache.budget().release(got);
            return Err(fmt(format!(
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
            let (parent, token, count) = (r.u32()? as usize, r.u32()?, r.u32()?);
            let Some((&p, &d)) = index.get(parent).zip(depth.get(parent)) else {
                cache.budget().release(t.nodes() + t.allowance);
                return Err(fmt(format!(
                    "node {} names parent {parent}, not yet read",
                    index.len()
                )));
            };
            if usize::from(d) >= max_depth {
                cache.budget().release(t.nodes() + t.allowance);
                return Err(fmt(format!(
                    "node {} is deeper than max_depth {max_depth}",
                    index.len()
                )));
            }
            let before = t.nodes();
            let c = t.child_or_insert(p, token);
            if c == NONE || t.nodes() == before {
                cache.budget().release(t.nodes() + t.allowance);
                return Err(fmt(format!(
                    "duplicate child {token} under file node {parent}"
                )));
            }
            t.bump(c, count);
            index.push(c);
            depth.push(d + 1);
        }
        t.compute_links();
        cache.install_history(&name, t);
    }
    if &r.bytes::<4>()? != END {
        return Err(fmt("save file has trailing garbage or is truncated".into()));
    }
    Ok(cache)
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
        v1.extend_from_slice(MAGIC);
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

    fn header(capacity: u64, depth: u32) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(MAGIC);
        v.extend_from_slice(&VERSION.to_le_bytes());
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
