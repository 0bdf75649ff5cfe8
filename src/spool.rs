//! The crash-safe spool (`spool_dir`): each closed window's chunks in a file of their own,
//! written before the window is queued and deleted once Redis has all of it, so that the next
//! start writes what a crashed (or timed-out) run had not. Replayed chunks keep their run's
//! sequence key and numbers, so Redis answers "applied before" for those the crashed run had
//! got in, and applies the rest once ([`Spool::load`]).
//!
//! A file is written whole under a temporary name and renamed into place, so a crash leaves
//! either the whole file or none; a checksum catches what a crash of the machine (without
//! `spool_fsync`) can leave behind.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::store::FlushChunk;

const MAGIC: &[u8; 8] = b"SRSPOOL1";
const EXTENSION: &str = "window";
/// Named for the first sums it held; it holds the quantile groups' too (`flush::state`).
const STATE_FILE: &str = "coarse.state";

/// A spool directory, locked by this agent while it runs.
#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    fsync: bool,
    /// Holds the directory's `flock`: two agents replaying one spool would both write it.
    _lock: File,
}

/// A window read back from the spool.
#[derive(Debug)]
pub struct SpooledWindow {
    pub start: u64,
    /// Its place among its run's windows, from 1: the order they were closed in, which is the
    /// order their chunks were numbered in even if the clock stepped back between them.
    pub number: u64,
    /// The sequence key of the run that numbered its chunks.
    pub sequence: String,
    pub chunks: Vec<Arc<FlushChunk>>,
    pub path: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("spool directory {dir}: {source}")]
    Io { dir: PathBuf, source: io::Error },
    #[error("spool directory {0} is in use by another agent")]
    Locked(PathBuf),
}

impl Spool {
    /// Creates (if need be) and locks `dir`; removes what an interrupted write left.
    pub fn open(dir: &Path, fsync: bool) -> Result<Spool, SpoolError> {
        let io_err = |source| SpoolError::Io {
            dir: dir.to_path_buf(),
            source,
        };
        fs::create_dir_all(dir).map_err(io_err)?;
        let lock = File::create(dir.join("lock")).map_err(io_err)?;
        // SAFETY: flock on a descriptor this function owns; no memory is passed.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(SpoolError::Locked(dir.to_path_buf()));
        }
        for entry in fs::read_dir(dir).map_err(io_err)?.flatten() {
            if entry.path().extension().is_some_and(|e| e == "tmp") {
                let _ = fs::remove_file(entry.path());
            }
        }
        Ok(Spool {
            dir: dir.to_path_buf(),
            fsync,
            _lock: lock,
        })
    }

    /// Writes a window's chunks, `number` being its place among its run's windows; returns
    /// the file to remove once they are all written.
    pub fn write(
        &self,
        start: u64,
        number: u64,
        sequence: &str,
        chunks: &[Arc<FlushChunk>],
    ) -> io::Result<PathBuf> {
        let name = format!(
            "{start:020}-{:016x}-{number:020}.{EXTENSION}",
            fnv1a(sequence.as_bytes())
        );
        let path = self.dir.join(name);
        self.replace(&path, &encode(start, sequence, chunks))?;
        if self.fsync {
            File::open(&self.dir)?.sync_all()?;
        }
        Ok(path)
    }

    /// Writes `bytes` whole under a temporary name and renames it to `path`, so a crash leaves
    /// the old file or the new one. On failure the temporary file goes (what a full disk let
    /// through of it is no use, and takes space).
    fn replace(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let tmp = path.with_extension("tmp");
        let written = (|| {
            let mut file = File::create(&tmp)?;
            file.write_all(bytes)?;
            if self.fsync {
                file.sync_all()?;
            }
            drop(file);
            fs::rename(&tmp, path)
        })();
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written
    }

    /// Removes a window's file once Redis has all of it (or the backlog dropped it).
    pub fn remove(&self, path: &Path) {
        if let Err(e) = fs::remove_file(path) {
            tracing::warn!(path = %path.display(), error = %e, "could not remove a spool file; its window would be written again (and answered as applied before) at the next start");
        }
    }

    /// Replaces the state file (the sums the closer holds back: `flush::state`) with `state`, as
    /// atomically as a window's file.
    ///
    /// When that fails (a full disk, a quota, an I/O error), the previous state file goes too:
    /// it holds sums that the closer may have written since (a group that ended and went out
    /// from memory), and taken up after a crash they would be applied twice. Without it a crash
    /// loses the sums held (the write failure is counted), never doubles them. Removing a file
    /// needs no free space; should even that fail, it is emptied in place, which a restart
    /// reads as a damaged file and does not take up.
    pub fn write_state(&self, state: Vec<u8>) -> io::Result<()> {
        let path = self.dir.join(STATE_FILE);
        let written = self.replace(&path, &seal(state));
        if written.is_err() {
            let removed = match fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => File::options()
                    .write(true)
                    .open(&path)
                    .and_then(|file| file.set_len(0)),
                _ => Ok(()),
            };
            if let Err(e) = removed {
                tracing::error!(path = %path.display(), error = %e, "cannot remove the outdated spool state file either: after a crash it would apply sums twice; remove it before the next start");
            }
        }
        written
    }

    /// The state file's contents, if there is one that reads back whole (else it is kept
    /// aside as `*.bad`).
    pub fn load_state(&self) -> Option<Vec<u8>> {
        let path = self.dir.join(STATE_FILE);
        let bytes = fs::read(&path).ok()?;
        match unseal(&bytes) {
            Some(state) => Some(state.to_vec()),
            None => {
                tracing::error!(path = %path.display(), "spool state file does not read back whole; the sums it held are lost");
                let _ = fs::rename(&path, path.with_extension("bad"));
                None
            }
        }
    }

    /// Every window spooled by earlier runs, in replay order: a run's windows in the order it
    /// closed them (its chunk numbers only grow in that order, and Redis takes a number below
    /// the last applied one as applied before), the runs by their earliest window. A file that
    /// does not read back whole is renamed `*.bad` and logged, never replayed or deleted.
    pub fn load(&self) -> io::Result<Vec<SpooledWindow>> {
        let paths: Vec<PathBuf> = fs::read_dir(&self.dir)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == EXTENSION))
            .collect();
        let mut windows = Vec::with_capacity(paths.len());
        for path in paths {
            let number = path
                .file_stem()
                .and_then(|stem| stem.to_str()?.rsplit('-').next()?.parse().ok());
            let decoded = fs::read(&path).ok().and_then(|bytes| decode(&bytes));
            match number.zip(decoded) {
                Some((number, (start, sequence, chunks))) => windows.push(SpooledWindow {
                    start,
                    number,
                    sequence,
                    chunks: chunks.into_iter().map(Arc::new).collect(),
                    path,
                }),
                None => {
                    let bad = path.with_extension("bad");
                    tracing::error!(path = %path.display(), kept_as = %bad.display(), "spool file does not read back whole; not replayed");
                    let _ = fs::rename(&path, &bad);
                }
            }
        }
        let mut first_start: HashMap<String, u64> = HashMap::new();
        for w in &windows {
            let start = first_start.entry(w.sequence.clone()).or_insert(w.start);
            *start = (*start).min(w.start);
        }
        windows.sort_by_cached_key(|w| (first_start[&w.sequence], w.sequence.clone(), w.number));
        Ok(windows)
    }
}

/// `MAGIC`, start, the sequence key, the chunks (number, series, ends, data), then a checksum
/// of all before it; integers little-endian.
fn encode(start: u64, sequence: &str, chunks: &[Arc<FlushChunk>]) -> Vec<u8> {
    let size: usize = chunks.iter().map(|c| c.bytes() + 20).sum();
    let mut out = Vec::with_capacity(size + sequence.len() + 40);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&start.to_le_bytes());
    put_bytes(&mut out, sequence.as_bytes());
    out.extend_from_slice(&(chunks.len() as u32).to_le_bytes());
    for chunk in chunks {
        put_chunk(&mut out, chunk);
    }
    seal(out)
}

/// Appends the checksum of everything before it.
fn seal(mut out: Vec<u8>) -> Vec<u8> {
    let sum = fnv1a(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// What [`seal`] sealed, if the checksum holds.
fn unseal(bytes: &[u8]) -> Option<&[u8]> {
    let (body, sum) = bytes.split_at_checked(bytes.len().checked_sub(8)?)?;
    (fnv1a(body) == u64::from_le_bytes(sum.try_into().ok()?)).then_some(body)
}

pub(crate) fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// A chunk's number, series, argument ends and bytes.
pub(crate) fn put_chunk(out: &mut Vec<u8>, chunk: &FlushChunk) {
    let (data, ends) = chunk.parts();
    out.extend_from_slice(&chunk.seq.to_le_bytes());
    out.extend_from_slice(&(chunk.series as u32).to_le_bytes());
    out.extend_from_slice(&(ends.len() as u32).to_le_bytes());
    for end in ends {
        out.extend_from_slice(&end.to_le_bytes());
    }
    put_bytes(out, data);
}

fn decode(bytes: &[u8]) -> Option<(u64, String, Vec<FlushChunk>)> {
    let mut r = ByteReader(unseal(bytes)?.strip_prefix(MAGIC)?);
    let start = r.u64()?;
    let sequence = r.string()?;
    let count = r.u32()? as usize;
    let chunks = (0..count).map(|_| r.chunk()).collect::<Option<Vec<_>>>()?;
    r.0.is_empty().then_some((start, sequence, chunks))
}

/// Reads what the `put_*` functions wrote; `None` past the end.
pub(crate) struct ByteReader<'a>(pub &'a [u8]);

impl<'a> ByteReader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    pub fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    pub fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    pub fn string(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?.to_vec()).ok()
    }

    pub fn chunk(&mut self) -> Option<FlushChunk> {
        let seq = self.u64()?;
        let series = self.u32()? as usize;
        let n = self.u32()? as usize;
        let ends = (0..n).map(|_| self.u32()).collect::<Option<Vec<u32>>>()?;
        let data = self.bytes()?.to_vec();
        FlushChunk::from_parts(seq, series, data, ends)
    }
}

/// FNV-1a, 64 bits: a checksum against torn files, not against an adversary.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::ClosedWindow;
    use crate::store::{ChunkSettings, CounterWrite, build_chunks};

    fn chunks() -> Vec<Arc<FlushChunk>> {
        let window = ClosedWindow {
            start: 100,
            counters: (0..250).map(|i| (format!("c{i}").into(), i)).collect(),
            ..ClosedWindow::default()
        };
        let settings = ChunkSettings::for_tests("p:", 100);
        let mut chunks = build_chunks(&window, &CounterWrite::everywhere(&[1, 60]), &settings);
        for (i, c) in chunks.iter_mut().enumerate() {
            c.seq = 7 + i as u64;
        }
        chunks.into_iter().map(Arc::new).collect()
    }

    fn same(a: &[Arc<FlushChunk>], b: &[Arc<FlushChunk>]) -> bool {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| (x.seq, x.series, x.parts()) == (y.seq, y.series, y.parts()))
    }

    #[test]
    fn a_window_reads_back_as_it_was_written_in_replay_order() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path(), false).unwrap();
        let later = spool.write(101, 2, "flush:a.1", &chunks()).unwrap();
        let earlier = spool.write(100, 1, "flush:a.1", &chunks()[..1]).unwrap();
        let loaded = spool.load().unwrap();
        assert_eq!(loaded.len(), 2);
        assert_eq!((loaded[0].start, loaded[0].path.clone()), (100, earlier));
        assert_eq!(
            (loaded[1].start, loaded[1].path.clone()),
            (101, later.clone())
        );
        assert_eq!(loaded[1].sequence, "flush:a.1");
        assert!(same(&loaded[1].chunks, &chunks()));
        spool.remove(&later);
        assert_eq!(spool.load().unwrap().len(), 1);
    }

    /// A clock stepped back gives a run two windows with one start, and a later window an
    /// earlier start: each keeps a file, and a run's windows replay in the order they closed.
    #[test]
    fn a_clock_stepped_back_changes_neither_the_files_nor_the_order() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path(), false).unwrap();
        let one = chunks();
        for (start, number, sequence, chunks) in [
            (300, 1, "flush:a.2", &one[..1]),
            (200, 1, "flush:a.1", &one[..]),
            (150, 2, "flush:a.1", &one[..1]),
            (150, 3, "flush:a.1", &one[..2]),
            (100, 1, "flush:a.0", &one[..1]),
        ] {
            spool.write(start, number, sequence, chunks).unwrap();
        }
        let loaded: Vec<_> = spool
            .load()
            .unwrap()
            .into_iter()
            .map(|w| (w.sequence, w.number, w.start, w.chunks.len()))
            .collect();
        let expected = [
            ("flush:a.0", 1, 100, 1),
            ("flush:a.1", 1, 200, one.len()),
            ("flush:a.1", 2, 150, 1),
            ("flush:a.1", 3, 150, 2),
            ("flush:a.2", 1, 300, 1),
        ];
        assert_eq!(
            loaded,
            expected.map(|(q, n, s, c)| (q.to_string(), n, s, c))
        );
    }

    #[test]
    fn a_damaged_file_is_kept_aside_not_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path(), true).unwrap();
        let path = spool.write(100, 1, "flush:a.1", &chunks()).unwrap();
        let mut bytes = fs::read(&path).unwrap();
        bytes[40] ^= 1;
        fs::write(&path, &bytes).unwrap();
        let short = spool.write(101, 2, "flush:a.1", &chunks()).unwrap();
        let len = fs::metadata(&short).unwrap().len();
        File::options()
            .write(true)
            .open(&short)
            .unwrap()
            .set_len(len / 2)
            .unwrap();
        assert!(spool.load().unwrap().is_empty());
        assert!(path.with_extension("bad").exists() && short.with_extension("bad").exists());
    }

    #[test]
    fn one_agent_per_directory() {
        let dir = tempfile::tempdir().unwrap();
        let _first = Spool::open(dir.path(), false).unwrap();
        assert!(matches!(
            Spool::open(dir.path(), false),
            Err(SpoolError::Locked(_))
        ));
    }
}
