use super::*;
use crate::cache::RequestId;

#[test]
fn save_load_round_trip() {
    let cfg = Config {
        max_depth: 5,
        capacity_nodes: 100_000,
        background_indexing: false,
        history_skip: Some((2, 3)),
        recycle_k: 3,
        recycle_slots: 777,
        recycle_weight: 0.25,
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
    save(&c, &path, None).unwrap();
    let d = load(&path, None, None, false).unwrap();
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
    assert_eq!(
        load(&path, None, None, false).err().unwrap().kind(),
        "Format"
    );
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
    let e = load(&path, None, None, false).err().unwrap();
    assert_eq!(e.kind(), "Format");
    assert!(e.to_string().contains("allow_legacy"), "{e}");
    let old = load(&path, None, None, true).unwrap();
    assert_eq!(
        (old.config().max_depth, old.config().history_skip),
        (6, None)
    );
    std::fs::write(&path, [&v1[..8], &9u32.to_le_bytes(), &v1[12..]].concat()).unwrap();
    assert_eq!(
        load(&path, None, None, false).err().unwrap().kind(),
        "Format"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Version 3 had no recycle settings: its files load with the defaults (recycling off, as
/// every version 3 cache that was loaded back had it).
#[test]
fn versions_3_and_4_load_with_the_defaults_they_lack() {
    let cfg = Config {
        max_depth: 5,
        capacity_nodes: 10_000,
        background_indexing: false,
        recycle_k: 4,
        ..Config::default()
    };
    let c = Cache::new(cfg).unwrap();
    c.add_history(&[vec![1, 2, 3, 1, 2, 4]], "default").unwrap();
    let dir = scratch("v3");
    let path = dir.join("h.bin");
    save(&c, &path, None).unwrap();
    let v6 = std::fs::read(&path).unwrap();
    // After the 50 bytes of magic, version and version 3's config: the recycle settings (20
    // bytes, from version 4), corpus_weight (8 bytes, from version 5), capacity_bytes (8,
    // from version 6) and meta's flag (1, from version 5); before the end marker, the
    // corpora count (version 5).
    let end = v6.len() - 16;
    let seal = |body: Vec<u8>| {
        let len = (body.len() as u64 + 16).to_le_bytes();
        let body = [&body[..], &len].concat();
        let hash = fnv1a(FNV_OFFSET, &body).to_le_bytes();
        std::fs::write(&path, [&body[..], &hash].concat()).unwrap();
        load(&path, None, None, false).unwrap()
    };
    let older = |version: u32, config_end: usize| {
        seal(
            [
                &v6[..8],
                &version.to_le_bytes(),
                &v6[12..config_end],
                &v6[87..end - 8],
                &v6[end - 4..end],
            ]
            .concat(),
        )
    };
    let d = Config::default();
    let old = older(3, 50);
    let got = old.config();
    assert_eq!(
        (got.recycle_k, got.recycle_slots, got.recycle_weight),
        (d.recycle_k, d.recycle_slots, d.recycle_weight)
    );
    assert_eq!((got.max_depth, got.capacity_nodes), (5, 10_000));
    assert_eq!(old.stats().nodes, c.stats().nodes);
    let v4 = older(4, 70);
    let got = v4.config();
    assert_eq!((got.recycle_k, got.corpus_weight), (4, d.corpus_weight));
    assert_eq!((v4.stats().nodes, v4.corpora().len()), (c.stats().nodes, 0));
    assert_eq!(v4.saved_meta(), None);
    let v5 = seal([&v6[..8], &5u32.to_le_bytes(), &v6[12..78], &v6[86..end]].concat());
    assert_eq!(v5.config().capacity_bytes, 0);
    assert_eq!(v5.stats().nodes, c.stats().nodes);
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
    let dir = std::env::temp_dir().join(format!("lookahead-persist-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn load_bytes(name: &str, bytes: &[u8]) -> Result<Cache> {
    let dir = scratch(name);
    let path = dir.join("f.bin");
    std::fs::write(&path, bytes).unwrap();
    let r = load(&path, Some(false), None, true); // version 2: its structural checks
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

    // Recycle settings out of range in a version 4 header (read before the checksum).
    let (dir, good) = saved_file("recycle");
    let path = dir.join("r.bin");
    let k = 65u32.to_le_bytes();
    let slots = u64::MAX.to_le_bytes();
    let weight = f64::NAN.to_le_bytes();
    for (at, bytes, what) in [
        (50, &k[..], "recycle_k"),
        (54, &slots[..], "recycle_slots"),
        (62, &weight[..], "recycle_weight"),
    ] {
        let mut bad = good.clone();
        bad[at..at + bytes.len()].copy_from_slice(bytes);
        std::fs::write(&path, &bad).unwrap();
        let e = load(&path, Some(false), None, false).err().unwrap();
        assert_eq!(e.kind(), "Format", "{e}");
        assert!(e.to_string().contains("bad configuration") && e.to_string().contains(what));
    }
    std::fs::remove_dir_all(&dir).unwrap();
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
    save(&c, &path, None).unwrap();
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
        // The first 160 flips cover the header (74 bytes, with the namespace count), the
        // first name and the trailer byte by byte.
        let at = if i < 160 {
            if i < 100 {
                i
            } else {
                bad.len() - (i - 99)
            }
        } else {
            at
        };
        bad[at] ^= ((x >> 32) as u8) | 1;
        std::fs::write(&path, &bad).unwrap();
        let e = load(&path, Some(false), None, false).err();
        let e = e.unwrap_or_else(|| panic!("flip at byte {at} of {} loaded", bad.len()));
        assert_eq!(e.kind(), "Format", "flip at {at}: {e}");
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
    }
    for tail in [&b"x"[..], &good[..]] {
        std::fs::write(&path, [&good[..], tail].concat()).unwrap();
        let e = load(&path, Some(false), None, false).err().unwrap();
        assert!(e.to_string().contains("bytes follow its end"), "{e}");
    }
    std::fs::write(&path, &good[..good.len() - 1]).unwrap();
    let e = load(&path, Some(false), None, false).err().unwrap();
    assert!(e.to_string().contains("truncated"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn io_errors_name_the_path_and_the_errno() {
    let dir = scratch("io");
    let missing = dir.join("missing.bin");
    let e = load(&missing, None, None, false).err().unwrap();
    assert_eq!(e.kind(), "NotFound");
    assert!(e.to_string().contains("missing.bin") && e.to_string().contains("os error 2"));
    let e = load(&dir, None, None, false).err().unwrap();
    assert_eq!(e.kind(), "Io");
    assert!(e.to_string().contains("directory"), "{e}");
    let c = Cache::new(Config::default()).unwrap();
    let e = save(&c, &dir.join("no/such/folder/h.bin"), None)
        .err()
        .unwrap();
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
    let c = load(&path, Some(false), None, false).unwrap();
    save(&c, &path, None).unwrap();
    assert!(!dead.exists() && live.exists() && other.exists() && young.exists());
    let nodes = |p: &Path| {
        load(p, Some(false), None, false)
            .unwrap()
            .stats()
            .history_nodes
    };
    assert_eq!(nodes(&path), c.stats().history_nodes);
    assert!(good.len() > 100);

    let target = dir.join("target.bin");
    let link = dir.join("link.bin");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    save(&c, &link, None).unwrap();
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
            std::thread::spawn(move || save(&c, &p, None))
        });
        for j in jobs {
            j.join().unwrap().unwrap();
        }
        for (c, p) in [(&a, &pa), (&b, &pb)] {
            let want = c.stats().history_nodes;
            assert_eq!(
                load(p, Some(false), None, false)
                    .unwrap()
                    .stats()
                    .history_nodes,
                want
            );
        }
    }
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(left.len(), 2, "temporary files left behind");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn mkfifo(path: &Path) {
    let c =
        std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str())).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// Special files: a load of a FIFO with no writer returns at once (it used to wait for a
/// writer, deaf to Ctrl-C), a load of a device is refused, and a save never replaces a FIFO
/// or a device with a regular file (as root, `save("/dev/null")` would have).
#[test]
fn special_files_are_neither_read_nor_replaced() {
    let dir = scratch("special");
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let t0 = std::time::Instant::now();
    let e = load(&fifo, None, None, false).err().unwrap();
    assert!(e.to_string().contains("not a regular file"), "{e}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(5));
    let e = load(Path::new("/dev/zero"), None, None, false)
        .err()
        .unwrap();
    assert!(e.to_string().contains("not a regular file"), "{e}");

    let c = Cache::new(Config::default()).unwrap();
    let link = dir.join("null-link");
    std::os::unix::fs::symlink(&fifo, &link).unwrap();
    for target in [&fifo, &link] {
        let e = save(&c, target, None).err().unwrap();
        assert_eq!(e.kind(), "InvalidInput");
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
    let ft = std::fs::symlink_metadata(&fifo).unwrap().file_type();
    assert!(
        std::os::unix::fs::FileTypeExt::is_fifo(&ft),
        "the FIFO was replaced"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A file name of 250 bytes (valid) saves: its temporary name is cut to fit the
/// file system's 255 bytes, and a stale temporary of it is found by the same prefix.
#[test]
fn a_long_file_name_saves() {
    let dir = scratch("long");
    let path = dir.join("n".repeat(250));
    let c = Cache::new(Config::default()).unwrap();
    c.add_history(&[vec![1, 2, 3, 1, 2, 4]], "default").unwrap();
    save(&c, &path, None).unwrap();
    assert_eq!(
        load(&path, Some(false), None, false)
            .unwrap()
            .stats()
            .history_nodes,
        c.stats().history_nodes
    );
    let tmp = temp_beside(&path).unwrap();
    assert!(tmp.file_name().unwrap().len() <= NAME_MAX);
    assert!(
        std::os::unix::ffi::OsStrExt::as_bytes(tmp.file_name().unwrap())
            .starts_with(&temp_prefix(path.file_name().unwrap()))
    );
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}"); // no temporary left behind
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn corpora_and_meta_survive_a_save() {
    let c = Cache::new(Config {
        max_depth: 5,
        capacity_nodes: 100_000,
        background_indexing: false,
        corpus_weight: 2.5,
        ..Config::default()
    })
    .unwrap();
    c.add_history(&[vec![1, 2, 3, 1, 2, 4]], "default").unwrap();
    for (id, scope, doc) in [
        ("m", None, vec![50u32, 51, 52, 53]),
        ("t", Some("a"), vec![60, 61, 62]),
    ] {
        let mut b = c.begin_corpus(id, scope).unwrap();
        b.add_part(&doc, 0..doc.len()).unwrap();
        c.commit_corpus(b).unwrap();
    }
    let dir = std::env::temp_dir().join(format!("lookahead-corpora-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.bin");
    save(&c, &path, Some("{\"tokenizer\": \"x\"}")).unwrap();
    let d = load(&path, None, None, false).unwrap();
    d.check_invariants().unwrap();
    assert_eq!(d.config(), c.config());
    assert_eq!(d.saved_meta(), Some("{\"tokenizer\": \"x\"}"));
    assert_eq!(d.corpora(), c.corpora());
    assert_eq!(d.stats().nodes, c.stats().nodes);
    let rid = RequestId::Int(1);
    d.start_request(rid.clone(), vec![9, 50, 51], "default")
        .unwrap();
    assert_eq!(d.draft(&rid, 2, false).unwrap().tokens, vec![51, 52, 53]);
    // Without meta: None back.
    save(&c, &path, None).unwrap();
    assert_eq!(load(&path, None, None, false).unwrap().saved_meta(), None);
    // Every single damaged byte of a file with corpora is refused.
    save(&c, &path, Some("m")).unwrap();
    let good = std::fs::read(&path).unwrap();
    for i in (0..good.len()).step_by(7) {
        let mut bad = good.clone();
        bad[i] ^= 0x41;
        std::fs::write(&path, &bad).unwrap();
        assert!(
            load(&path, None, None, false).is_err(),
            "byte {i} damaged loaded"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
