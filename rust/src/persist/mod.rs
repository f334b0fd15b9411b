//! save / load of the shared histories (a warm start). Prompts of live requests are not saved.
//!
//! Format, little-endian, version 6:
//! ```text
//! magic  b"LKAHSAV3"  | version u32 | max_depth u32 | capacity_nodes u64
//! own_weight f64   | history_weight f64 | keep_prompt_as_history u8 | background_indexing u8
//! history_skip lo u32 | hi u32 (0, 0: none)
//! recycle_k u32 | recycle_slots u64 | recycle_weight f64
//! corpus_weight f64 | capacity_bytes u64 | meta: has u8, then len u32 | meta (UTF-8)
//! namespaces u32, then per namespace:
//!   name_len u32 | name (UTF-8) | trie
//! corpora u32, then per corpus:
//!   id_len u32 | id (UTF-8) | has_scope u8, then len u32 | scope | tokens u64 | cut u8 | trie
//! b"END!" | file_len u64 (of the whole file) | checksum u64
//! trie: nodes u64 | nodes x (parent u32, token u32, count u32)
//! ```
//! `meta` is the saver's own text (the SGLang plugin keeps the tokenizer's fingerprint
//! there), handed back by `load`. Version 4 (no corpus_weight, meta or corpora) loads with
//! the default corpus weight, no meta and no corpora; version 5 (no capacity_bytes) with no
//! byte budget.
//! The checksum is FNV-1a 64 over every byte before it. Each step of FNV-1a is a bijection
//! of the state, so any change confined to one byte always changes it; other damage goes
//! unnoticed with probability about 2^-64 (it guards against corruption, not an attacker).
//! A file is refused unless its checksum, its length field and its actual length agree,
//! with nothing after the checksum.
//!
//! The recycled predictions themselves are not saved (they belong to the requests that
//! produced them), only the settings: a loaded cache recycles as the saved one did.
//! Version 3 (the same magic and checksum, no recycle settings) loads with the defaults,
//! recycling off, as its caches had to be. Versions 1 and 2 (magic b"LKAHTRIE", no checksum;
//! version 1 had no `history_skip`, so it loads with None) still load, with the same
//! structural checks and no trailing bytes. Their magic differs from the checksummed
//! versions' in four bytes, so no single damaged byte turns such a file into one that skips
//! the checksum.
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
use crate::cache::{
    Cache, Config, Corpus, MAX_CORPORA, MAX_CORPUS_ID_BYTES, MAX_INDEX_THREADS, MAX_NAMESPACE_BYTES,
};
use crate::error::{Error, Result};
use crate::trie::{Trie, ROOT};

/// Magic of the checksummed versions, 3 and up.
const MAGIC: &[u8; 8] = b"LKAHSAV3";
/// Magic of versions 1 and 2.
const LEGACY_MAGIC: &[u8; 8] = b"LKAHTRIE";
const END: &[u8; 4] = b"END!";
pub const VERSION: u32 = 6;
/// The first version with corpora, `corpus_weight` and meta.
const WITH_CORPORA: u32 = 5;
/// The first version with `capacity_bytes`.
const WITH_BYTES: u32 = 6;
/// Longest `meta` text, in bytes.
pub const MAX_META_BYTES: usize = 1 << 20;
/// The first version with a checksum (and `MAGIC`).
const CHECKSUMMED: u32 = 3;
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

/// The longest file name most file systems take (ext4, xfs, btrfs, tmpfs: 255 bytes).
const NAME_MAX: usize = 255;
/// Bytes a temporary name adds to its prefix: `.<pid>.<n>` (10 + 20 digits at most) and the
/// suffix.
const TEMP_TAIL: usize = 2 + 10 + 20 + TMP_SUFFIX.len();

/// What every temporary name of saves to a file named `name` starts with: the name, cut so
/// that the whole temporary name stays within `NAME_MAX` (a valid 250-byte name must not
/// fail because its temporary one is too long), then a dot.
fn temp_prefix(name: &std::ffi::OsStr) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = name.as_bytes();
    let mut out = bytes[..bytes.len().min(NAME_MAX - TEMP_TAIL)].to_vec();
    out.push(b'.');
    out
}

/// A temporary file beside `path`, unique to this save: concurrent saves (to one path, or to
/// `h.bin` and `h.dat`) never write into each other's file.
fn temp_beside(path: &Path) -> Result<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    static SAVES: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .ok_or_else(|| Error::InvalidInput(format!("{} names no file", path.display())))?;
    let n = SAVES.fetch_add(1, Ordering::Relaxed);
    let mut temp = temp_prefix(name);
    temp.extend_from_slice(format!("{}.{n}{TMP_SUFFIX}", std::process::id()).as_bytes());
    Ok(path.with_file_name(std::ffi::OsString::from_vec(temp)))
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
    let prefix = temp_prefix(name);
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(rest) = std::os::unix::ffi::OsStrExt::as_bytes(file.as_os_str())
            .strip_prefix(prefix.as_slice())
            .and_then(|r| std::str::from_utf8(r).ok())
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
pub fn save(cache: &Cache, path: &Path, meta: Option<&str>) -> Result<()> {
    if let Some(m) = meta.filter(|m| m.len() > MAX_META_BYTES) {
        return Err(Error::InvalidInput(format!(
            "meta is at most {MAX_META_BYTES} bytes, got {}",
            m.len()
        )));
    }
    let path = resolve(path)?;
    // A rename replaces whatever the path names: a FIFO, a device (as root, /dev/null), a
    // socket. Saves replace regular files only.
    if let Ok(m) = std::fs::metadata(&path) {
        if !m.is_file() {
            return Err(Error::InvalidInput(format!(
                "cannot save to {}: it is not a regular file (a save replaces only regular \
                 files)",
                path.display()
            )));
        }
    }
    remove_stale_temps(&path);
    let tmp = temp_beside(&path)?;
    let written = write_to(cache, &tmp, meta)
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

fn write_to(cache: &Cache, tmp: &Path, meta: Option<&str>) -> Result<()> {
    let err = |e: std::io::Error| Error::io("write", tmp, &e);
    let file = File::create(tmp).map_err(err)?;
    let mut w = Summing {
        w: BufWriter::new(file),
        hash: FNV_OFFSET,
        len: 0,
    };
    write_body(cache, &mut w, meta).map_err(err)?;
    let len = w.len + 16;
    w.write_all(&len.to_le_bytes()).map_err(err)?;
    let hash = w.hash;
    w.write_all(&hash.to_le_bytes()).map_err(err)?;
    let file = w.w.into_inner().map_err(|e| err(e.into_error()))?;
    file.sync_all().map_err(err)
}

fn write_body(cache: &Cache, w: &mut impl Write, meta: Option<&str>) -> std::io::Result<()> {
    let c = cache.config();
    w.write_all(MAGIC)?;
    w.write_all(&VERSION.to_le_bytes())?;
    w.write_all(&(c.max_depth as u32).to_le_bytes())?;
    w.write_all(&c.capacity_nodes.to_le_bytes())?;
    w.write_all(&c.own_weight.to_le_bytes())?;
    w.write_all(&c.history_weight.to_le_bytes())?;
    w.write_all(&[
        u8::from(c.keep_prompt_as_history),
        u8::from(c.background_indexing),
    ])?;
    let (lo, hi) = c.history_skip.unwrap_or((0, 0));
    w.write_all(&(lo as u32).to_le_bytes())?;
    w.write_all(&(hi as u32).to_le_bytes())?;
    w.write_all(&(c.recycle_k as u32).to_le_bytes())?;
    w.write_all(&(c.recycle_slots as u64).to_le_bytes())?;
    w.write_all(&c.recycle_weight.to_le_bytes())?;
    w.write_all(&c.corpus_weight.to_le_bytes())?;
    w.write_all(&c.capacity_bytes.to_le_bytes())?;
    write_text(w, meta)?;
    let all = cache.namespaces();
    w.write_all(&(all.len() as u32).to_le_bytes())?;
    for ns in all {
        // Writers are held off for the walk (their steps leave their tokens for later);
        // drafts go on reading.
        let _hold = ns.hold_long();
        let h = ns.history.read().unwrap_or_else(|e| e.into_inner());
        w.write_all(&(ns.name.len() as u32).to_le_bytes())?;
        w.write_all(ns.name.as_bytes())?;
        write_trie(w, &h)?;
    }
    let corpora = cache.corpora_arcs();
    w.write_all(&(corpora.len() as u32).to_le_bytes())?;
    for c in corpora {
        w.write_all(&(c.id.len() as u32).to_le_bytes())?;
        w.write_all(c.id.as_bytes())?;
        write_text(w, c.scope.as_deref())?;
        w.write_all(&c.tokens.to_le_bytes())?;
        w.write_all(&[u8::from(c.cut)])?;
        write_trie(w, &c.trie)?;
    }
    w.write_all(END)?;
    w.flush()
}

/// An optional text: a flag byte, then its length and bytes.
fn write_text(w: &mut impl Write, text: Option<&str>) -> std::io::Result<()> {
    match text {
        None => w.write_all(&[0]),
        Some(t) => {
            w.write_all(&[1])?;
            w.write_all(&(t.len() as u32).to_le_bytes())?;
            w.write_all(t.as_bytes())
        }
    }
}

/// A trie's nodes, breadth-first (file node i's children after it; 0: the root).
fn write_trie(w: &mut impl Write, h: &Trie) -> std::io::Result<()> {
    w.write_all(&h.nodes().to_le_bytes())?;
    // `queue[i]` is the arena index of file node i (0: root).
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
    Ok(())
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
    /// A length-prefixed UTF-8 text of at most `max` bytes (`what`, for errors).
    fn text(&mut self, max: usize, what: &str) -> Result<String> {
        let len = self.u32()? as usize;
        if len > max {
            return Err(self.damaged(&format!("{what} of {len} bytes")));
        }
        let mut b = vec![0u8; len];
        self.fill(&mut b)?;
        String::from_utf8(b).map_err(|_| self.damaged(&format!("{what} is not UTF-8")))
    }
    /// A flag byte: 0 or 1.
    fn flag(&mut self) -> Result<bool> {
        match self.bytes::<1>()? {
            [0] => Ok(false),
            [1] => Ok(true),
            _ => Err(self.damaged("a flag byte is neither 0 nor 1")),
        }
    }
    /// What `write_text` wrote: a flag, then (if set) a text of at most `max` bytes.
    fn optional_text(&mut self, max: usize, what: &str) -> Result<Option<String>> {
        if self.flag()? {
            self.text(max, what).map(Some)
        } else {
            Ok(None)
        }
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
/// machine, not the data): `None` is 0, as many as the cores allow. Versions 1 and 2 have
/// no checksum (most damaged bytes load silently) and their counts are not bounded the way
/// version 4's are (a crafted file can inflate 35x in memory): they load only with
/// `allow_legacy`, for files one trusts, to be saved again as version 4.
pub fn load(
    path: &Path,
    background_indexing: Option<bool>,
    index_threads: Option<usize>,
    allow_legacy: bool,
) -> Result<Cache> {
    if let Some(n) = index_threads.filter(|&n| n > MAX_INDEX_THREADS) {
        return Err(Error::InvalidInput(format!(
            "index_threads must be in 0..={MAX_INDEX_THREADS}, got {n}"
        )));
    }
    // Opened without blocking (a FIFO with no writer would wait forever, deaf to Ctrl-C),
    // then refused unless it is a regular file (a FIFO, a device such as /dev/zero, a folder).
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| Error::io("open", path, &e))?
    };
    let meta = file.metadata().map_err(|e| Error::io("open", path, &e))?;
    if !meta.is_file() {
        let what = if meta.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        return Err(Error::Io(format!(
            "cannot load {}: it is {what}",
            path.display()
        )));
    }
    let mut r = Reader {
        r: BufReader::new(file),
        path,
        hash: FNV_OFFSET,
        len: 0,
    };
    let (cache, version) = read_body(&mut r, background_indexing, index_threads, allow_legacy)?;
    if version >= CHECKSUMMED {
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
    allow_legacy: bool,
) -> Result<(Cache, u32)> {
    let magic = r.bytes::<8>()?;
    let version = r.u32()?;
    let known = match &magic {
        m if m == MAGIC => (CHECKSUMMED..=VERSION).contains(&version),
        m if m == LEGACY_MAGIC => (1..CHECKSUMMED).contains(&version),
        _ => return Err(r.damaged("no lookahead save file magic")),
    };
    if !known {
        return Err(r.damaged(&format!(
            "version {version} under magic {:?}; this build reads versions 1 to {VERSION}",
            String::from_utf8_lossy(&magic)
        )));
    }
    if version < CHECKSUMMED && !allow_legacy {
        return Err(Error::Format(format!(
            "{} is a version {version} save file, which has no checksum: load it with \
             allow_legacy=True only if you trust it, then save it again (version {VERSION})",
            r.path.display()
        )));
    }
    let max_depth = r.u32()? as usize;
    let capacity_nodes = r.u64()?;
    let own_weight = r.f64()?;
    let history_weight = r.f64()?;
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
    let (recycle_k, recycle_slots, recycle_weight) = if version >= 4 {
        let k = r.u32()? as usize;
        // Out-of-range values are refused by `Cache::new` below, as a damaged file.
        let slots = usize::try_from(r.u64()?).unwrap_or(usize::MAX);
        (k, slots, r.f64()?)
    } else {
        let d = Config::default();
        (d.recycle_k, d.recycle_slots, d.recycle_weight)
    };
    let (corpus_weight, capacity_bytes, meta) = if version >= WITH_CORPORA {
        let w = r.f64()?;
        let bytes = if version >= WITH_BYTES { r.u64()? } else { 0 };
        let meta = r.optional_text(MAX_META_BYTES, "its meta")?;
        (w, bytes, meta)
    } else {
        (Config::default().corpus_weight, 0, None)
    };
    let cfg = Config {
        max_depth,
        capacity_nodes,
        own_weight,
        history_weight,
        keep_prompt_as_history: keep != 0,
        background_indexing: background_indexing.unwrap_or(bg != 0),
        index_threads: index_threads.unwrap_or(0),
        history_skip,
        recycle_k,
        recycle_slots,
        recycle_weight,
        corpus_weight,
        capacity_bytes,
    };
    let mut cache = Cache::new(cfg).map_err(|e| match e {
        Error::InvalidInput(m) => r.damaged(&format!("it holds a bad configuration: {m}")),
        other => other,
    })?;
    let n_ns = r.u32()?;
    let mut names = HashSet::new();
    for _ in 0..n_ns {
        let name = r.text(MAX_NAMESPACE_BYTES, "a namespace name")?;
        if !names.insert(name.clone()) {
            return Err(r.damaged(&format!("namespace {name:?} appears twice")));
        }
        let t = read_trie(r, &cache, max_depth, &format!("namespace {name:?}"))?;
        cache.install_history(&name, t);
    }
    if version >= WITH_CORPORA {
        let n = r.u32()? as usize;
        if n > MAX_CORPORA {
            return Err(r.damaged(&format!("{n} corpora, more than {MAX_CORPORA}")));
        }
        let mut ids = HashSet::new();
        for _ in 0..n {
            let id = r.text(MAX_CORPUS_ID_BYTES, "a corpus id")?;
            if id.is_empty() || !ids.insert(id.clone()) {
                return Err(r.damaged(&format!("corpus id {id:?} is empty or appears twice")));
            }
            let scope = r.optional_text(MAX_NAMESPACE_BYTES, "a corpus scope")?;
            let tokens = r.u64()?;
            let cut = r.flag()?;
            let t = read_trie(r, &cache, max_depth, &format!("corpus {id:?}"))?;
            cache.install_corpus(std::sync::Arc::new(Corpus::new(id, scope, tokens, cut, t)));
        }
    }
    if &r.bytes::<4>()? != END {
        return Err(r.damaged("its end marker is missing"));
    }
    cache.set_saved_meta(meta);
    Ok((cache, version))
}

/// A trie as `write_trie` wrote it, its nodes reserved from `cache`'s budget (`what`
/// names it in errors).
fn read_trie<R: Read>(
    r: &mut Reader<'_, R>,
    cache: &Cache,
    max_depth: usize,
    what: &str,
) -> Result<Trie> {
    let n = r.u64()?;
    let got = cache.budget().reserve_up_to(n);
    if got < n {
        cache.budget().release(got);
        return Err(r.damaged(&format!(
            "{what} holds {n} nodes, more than the capacity left"
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
                        Some(
                            r.damaged(&format!("duplicate child {token} under file node {parent}")),
                        )
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
    Ok(t)
}

#[cfg(test)]
mod tests;
