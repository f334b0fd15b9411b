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

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use crate::arena::NONE;
use crate::cache::{Cache, Config};
use crate::error::{Error, Result};
use crate::trie::{Trie, ROOT};

const MAGIC: &[u8; 8] = b"LKAHTRIE";
const END: &[u8; 4] = b"END!";
pub const VERSION: u32 = 2;

pub fn save(cache: &Cache, path: &Path) -> Result<()> {
    let tmp = path.with_extension("tmp-lookahead");
    {
        let mut w = BufWriter::new(File::create(&tmp)?);
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
    std::fs::rename(&tmp, path)?;
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
/// overrides the saved setting when given.
pub fn load(path: &Path, background_indexing: Option<bool>) -> Result<Cache> {
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
        index_threads: 0,
        history_skip,
    };
    let cache =
        Cache::new(cfg).map_err(|e| fmt(format!("save file holds a bad configuration: {e}")))?;
    let n_ns = r.u32()?;
    for _ in 0..n_ns {
        let len = r.u32()? as usize;
        if len > 1 << 20 {
            return Err(fmt(format!("namespace name of {len} bytes")));
        }
        let mut name = vec![0u8; len];
        r.0.read_exact(&mut name)
            .map_err(|e| fmt(format!("save file is truncated: {e}")))?;
        let name =
            String::from_utf8(name).map_err(|_| fmt("namespace name is not UTF-8".into()))?;
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
        let mut index = Vec::with_capacity(n as usize + 1);
        index.push(ROOT);
        for _ in 0..n {
            let (parent, token, count) = (r.u32()? as usize, r.u32()?, r.u32()?);
            let Some(&p) = index.get(parent) else {
                cache.budget().release(t.nodes() + t.allowance);
                return Err(fmt(format!(
                    "node {} names parent {parent}, not yet read",
                    index.len()
                )));
            };
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
        let d = load(&path, None).unwrap();
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
        assert_eq!(load(&path, None).err().unwrap().kind(), "Format");
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
        let old = load(&path, None).unwrap();
        assert_eq!(
            (old.config().max_depth, old.config().history_skip),
            (6, None)
        );
        std::fs::write(&path, [&v1[..8], &9u32.to_le_bytes(), &v1[12..]].concat()).unwrap();
        assert_eq!(load(&path, None).err().unwrap().kind(), "Format");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
