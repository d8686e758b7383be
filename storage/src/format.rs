//! On-disk layouts: every byte is described here and in `docs/format.md`.
//! Little-endian, fixed widths, no `usize`.
//!
//! Decoders take slices whose length the caller has checked against the
//! layout's fixed size (asserted), so field reads cannot go out of bounds.

use crate::disk::PAGE_BYTES;
use crate::error::CorruptReason;

pub const BATCH_MAGIC: [u8; 8] = *b"MGNTBAT1";
pub const CHECKPOINT_MAGIC: [u8; 8] = *b"MGNTCKP1";
pub const CLEAN_MAGIC: [u8; 8] = *b"MGNTCLN1";
pub const INDEX_MAGIC: [u8; 4] = *b"MIDX";
pub const FORMAT_VERSION: u16 = 1;
/// Version written in batch headers. 2 (issue 3, compaction): a batch may
/// hold [`KIND_MOVE`] records; otherwise the layout is version 1's, which is
/// still read.
pub const BATCH_VERSION: u16 = 2;
/// Version written in checkpoints. 2 (issue 3, compaction): a relocation
/// table follows the metadata snapshot. Version 1 (no table) is still read.
pub const CHECKPOINT_VERSION: u16 = 2;

pub const BATCH_HEADER_BYTES: usize = 64;
pub const RECORD_HEADER_BYTES: usize = 48;
pub const INDEX_PAGE_HEADER_BYTES: usize = 32;
pub const INDEX_ENTRY_BYTES: usize = 32;
pub const INDEX_ENTRIES_PER_PAGE: usize = (PAGE_BYTES as usize - INDEX_PAGE_HEADER_BYTES) / INDEX_ENTRY_BYTES;
pub const CHECKPOINT_HEADER_BYTES: usize = 64;
pub const CHECKPOINT_LEDGER_BYTES: usize = 24;
pub const CLEAN_BYTES: usize = 64;
pub const CHECKPOINT_RELOCATION_BYTES: usize = 32;

pub const KIND_ENTRY: u8 = 1;
pub const KIND_META: u8 = 2;
/// A ledger deletion: `ledger` set, no body; every entry of the ledger
/// before it in log order is dead.
pub const KIND_DELETE: u8 = 3;
/// A relocated copy of an entry (segment compaction): same header fields
/// and body as the entry record it copies (`ledger`, `entry`, extras), only
/// the kind differs. Replay points the entry's index at this copy; a copy of
/// an entry whose ledger is gone is ignored.
pub const KIND_MOVE: u8 = 4;

/// Largest metadata key (its length is stored in a u16).
pub const META_KEY_BYTES_MAX: usize = u16::MAX as usize;

const _: () = assert!(BATCH_HEADER_BYTES <= PAGE_BYTES as usize);
const _: () = assert!(INDEX_PAGE_HEADER_BYTES + INDEX_ENTRIES_PER_PAGE * INDEX_ENTRY_BYTES <= PAGE_BYTES as usize);
const _: () = assert!(INDEX_ENTRIES_PER_PAGE == 127);
const _: () = assert!(CLEAN_BYTES <= PAGE_BYTES as usize);

pub fn rd_u16(b: &[u8], off: usize) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[off..off + 2]);
    u16::from_le_bytes(a)
}
pub fn rd_u32(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}
pub fn rd_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}
fn wr(b: &mut [u8], off: usize, v: &[u8]) {
    b[off..off + v.len()].copy_from_slice(v);
}

pub fn pad_to_page(n: u64) -> u64 {
    n.div_ceil(PAGE_BYTES) * PAGE_BYTES
}

pub fn crc(parts: &[&[u8]]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for p in parts {
        h.update(p);
    }
    h.finalize()
}

// ---------------------------------------------------------------- batch header

/// The 64-byte header that opens every batch, on a page boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    /// Whole batch including header and zero padding; a multiple of 4096.
    pub batch_len: u32,
    pub record_count: u32,
    /// Batch sequence number: consecutive, from 0, over the whole log.
    pub seq: u64,
    /// Log position of this header (guards against misplaced or stale pages).
    pub position: u64,
    /// Bytes of records after the header (the rest up to batch_len is zeros).
    pub records_len: u32,
    /// CRC-32 of bytes [64, batch_len) of the batch: records and padding.
    pub body_crc: u32,
    /// [`BATCH_FLAG_OVER_STALE`] or 0.
    pub flags: u16,
    /// Length of the segment file the batch was written into, as it was
    /// preallocated (and made durable) before any batch went into it; 0 =
    /// not recorded (written before the field existed). A segment file
    /// shorter than this was truncated after the fact: a crash cannot
    /// shrink it (see docs/format.md, "What a crash leaves").
    pub segment_len: u64,
}

/// Batch flag: the batch was written into a recycled segment, over bytes of
/// an earlier use of the file rather than zeros, so a tear of it need not
/// leave a zero sector (see [`could_be_torn`]).
pub const BATCH_FLAG_OVER_STALE: u16 = 1;

impl BatchHeader {
    pub fn encode(&self, out: &mut [u8]) {
        assert!(out.len() >= BATCH_HEADER_BYTES);
        let b = &mut out[..BATCH_HEADER_BYTES];
        b.fill(0);
        wr(b, 0, &BATCH_MAGIC);
        wr(b, 12, &BATCH_VERSION.to_le_bytes());
        wr(b, 14, &self.flags.to_le_bytes());
        wr(b, 16, &self.batch_len.to_le_bytes());
        wr(b, 20, &self.record_count.to_le_bytes());
        wr(b, 24, &self.seq.to_le_bytes());
        wr(b, 32, &self.position.to_le_bytes());
        wr(b, 40, &self.records_len.to_le_bytes());
        wr(b, 44, &self.body_crc.to_le_bytes());
        wr(b, 48, &self.segment_len.to_le_bytes());
        let c = crc(&[&b[12..BATCH_HEADER_BYTES]]);
        wr(b, 8, &c.to_le_bytes());
    }

    /// Checks magic, header checksum, version and internal consistency.
    pub fn decode(b: &[u8]) -> Result<BatchHeader, CorruptReason> {
        assert!(b.len() >= BATCH_HEADER_BYTES);
        let b = &b[..BATCH_HEADER_BYTES];
        if b[0..8] != BATCH_MAGIC {
            return Err(CorruptReason::BadMagic);
        }
        let stored = rd_u32(b, 8);
        let computed = crc(&[&b[12..]]);
        if stored != computed {
            return Err(CorruptReason::HeaderCrc { stored, computed });
        }
        let version = rd_u16(b, 12);
        if !(1..=BATCH_VERSION).contains(&version) {
            return Err(CorruptReason::Version(version));
        }
        let h = BatchHeader {
            batch_len: rd_u32(b, 16),
            record_count: rd_u32(b, 20),
            seq: rd_u64(b, 24),
            position: rd_u64(b, 32),
            records_len: rd_u32(b, 40),
            body_crc: rd_u32(b, 44),
            flags: rd_u16(b, 14),
            segment_len: rd_u64(b, 48),
        };
        let len = h.batch_len as u64;
        if len == 0 || !len.is_multiple_of(PAGE_BYTES) {
            return Err(CorruptReason::Field { field: "batch_len", expected: PAGE_BYTES, found: len });
        }
        if BATCH_HEADER_BYTES as u64 + h.records_len as u64 > len {
            return Err(CorruptReason::Length { len: h.records_len as u64, limit: len - BATCH_HEADER_BYTES as u64 });
        }
        Ok(h)
    }
}

impl BatchHeader {
    /// Verifies the body checksum of a whole batch (`b` is the batch from
    /// its header on, at least `batch_len` bytes).
    pub fn verify_body(&self, b: &[u8]) -> Result<(), CorruptReason> {
        let len = self.batch_len as usize;
        if b.len() < len {
            return Err(CorruptReason::ShortFile { len: b.len() as u64, need: len as u64 });
        }
        let computed = crc(&[&b[BATCH_HEADER_BYTES..len]]);
        if computed != self.body_crc {
            return Err(CorruptReason::BodyCrc { stored: self.body_crc, computed });
        }
        Ok(())
    }
}

/// Bits of a batch header's magic, `seq` and `position` that may differ
/// from the expected ones for [`header_written_here`] to still say yes.
pub const HEADER_MATCH_BITS_MAX: u32 = 16;

/// Whether the first page `page` of a batch whose header fails its checks
/// is nevertheless the header of batch `seq` at log position `position`,
/// written there and damaged since: its magic, `seq` and `position` (192
/// bits) are within [`HEADER_MATCH_BITS_MAX`] flipped bits of the expected
/// ones. A header sector is written atomically (a torn write leaves it
/// old or new), and its old content cannot be that close: zeros differ in
/// at least 25 bits (the magic's), and stale bytes of a recycled segment
/// hold positions from before the segment's start, since positions are
/// never reused (a crafted payload aside, as for stale batches). So a
/// header that fails but says yes here was written whole, and its batch
/// was at least submitted: it may have been acknowledged. Rot, not a tear.
pub fn header_written_here(page: &[u8], seq: u64, position: u64) -> bool {
    if page.len() < BATCH_HEADER_BYTES {
        return false;
    }
    let dist = |a: &[u8], b: &[u8]| a.iter().zip(b).map(|(x, y)| (x ^ y).count_ones()).sum::<u32>();
    dist(&page[0..8], &BATCH_MAGIC)
        + dist(&page[24..32], &seq.to_le_bytes())
        + dist(&page[32..40], &position.to_le_bytes())
        <= HEADER_MATCH_BITS_MAX
}

/// Whether the first record header of a last batch whose own header fails
/// (bytes 64..112 of its first page `page`) holds the next entry of a
/// ledger (`next_entry` gives a ledger's next entry id, `None` for one not
/// known). That record was written by this use of the segment: an entry id
/// is written once, at a position after every earlier one, and what a cut
/// removed was zeroed, so neither stale bytes of a recycled file nor an
/// earlier try hold it. So the header's sector, which holds both and lands
/// whole, was written, and the header was damaged since, even when its
/// magic, number and position went together ([`header_written_here`]
/// catches lighter damage). A batch that starts with a new ledger's first
/// entry or another kind of record is not recognised this way.
pub fn first_record_written_here(page: &[u8], next_entry: impl Fn(u64) -> Option<u64>) -> bool {
    let Some(rec) = page.get(BATCH_HEADER_BYTES..BATCH_HEADER_BYTES + RECORD_HEADER_BYTES) else { return false };
    let Ok(rh) = RecordHeader::decode(rec) else { return false };
    rh.kind == KIND_ENTRY && next_entry(rh.ledger) == Some(rh.entry)
}

/// Records with at least this many body bytes join [`BodyCrc`] by combining
/// their own checksum: a combine costs ~0.3 µs here, hashing 16 KiB ~0.8 µs.
pub const BODY_CRC_COMBINE_MIN: usize = 8 << 10;

/// A batch's body checksum ([`BatchHeader::body_crc`]) built while its
/// records are laid out, so that a large record's bytes are hashed once (for
/// the record's own checksum) and not read again for the batch's: its
/// checksum over header bytes [4..48] and body is combined in, behind the 4
/// bytes of that checksum as stored. Smaller records and the padding are
/// hashed as bytes. Same result as `crc(&[&batch[BATCH_HEADER_BYTES..]])`.
pub struct BodyCrc {
    h: crc32fast::Hasher,
    /// `buf[BATCH_HEADER_BYTES..covered]` is in `h`.
    covered: usize,
}

impl Default for BodyCrc {
    fn default() -> Self {
        Self::new()
    }
}

impl BodyCrc {
    pub fn new() -> BodyCrc {
        BodyCrc { h: crc32fast::Hasher::new(), covered: BATCH_HEADER_BYTES }
    }

    /// The record at `batch[off..]`, whose header is written with checksum
    /// `crc` and whose body of `body_len` bytes follows it; records come in
    /// order.
    pub fn record(&mut self, batch: &[u8], off: usize, crc: u32, body_len: usize) {
        assert!(off >= self.covered, "records are laid out in order");
        if body_len < BODY_CRC_COMBINE_MIN {
            return;
        }
        debug_assert_eq!(rd_u32(batch, off), crc);
        self.h.update(&batch[self.covered..off + 4]);
        let rest = (RECORD_HEADER_BYTES - 4 + body_len) as u64;
        self.h.combine(&crc32fast::Hasher::new_with_initial_len(crc, rest));
        self.covered = off + RECORD_HEADER_BYTES + body_len;
    }

    /// The checksum of `batch[BATCH_HEADER_BYTES..]`, records and padding.
    pub fn finish(mut self, batch: &[u8]) -> u32 {
        self.h.update(&batch[self.covered..]);
        self.h.finalize()
    }
}

/// The smallest unit a device writes atomically; a torn write leaves whole
/// sectors old or new.
pub const SECTOR_BYTES: usize = 512;

/// Whether a last batch whose body checksum fails can be a torn write. A
/// torn write leaves some sectors as they were, and the space behind the tail
/// is zero (segments are preallocated and torn regions are zeroed before
/// reuse), so a tear implies an all-zero sector among the records. Except in
/// a recycled segment (the batch has [`BATCH_FLAG_OVER_STALE`]): there any
/// failing last batch could be torn.
/// Without one the batch was complete and has rotted: it may have been
/// acknowledged, so it must be reported, never dropped. (Records that
/// themselves hold 512 aligned zero bytes make rot there look like a tear:
/// documented in `docs/format.md`.) Only sectors holding records count: a
/// tear in the zero padding changes nothing. `b` holds the whole batch.
pub fn could_be_torn(h: &BatchHeader, b: &[u8]) -> bool {
    if h.flags & BATCH_FLAG_OVER_STALE != 0 {
        // Written over stale bytes: a tear leaves old non-zero sectors, so
        // rot and a tear cannot be told apart (docs/format.md).
        return true;
    }
    let used = BATCH_HEADER_BYTES + h.records_len as usize;
    if b.len() < h.batch_len as usize || used > b.len() {
        return true;
    }
    b[..used].chunks(SECTOR_BYTES).any(|c| c.iter().all(|&x| x == 0))
}

// ---------------------------------------------------------------- records

/// Per-entry values the index keeps beside the position (issue 3 uses them
/// for seek by time and lookup by key; issue 4's tag filter uses the tag
/// hash to skip entries without reading them). Zero means "not given".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexExtras {
    pub publish_time_ms: u64,
    pub key_hash: u32,
    /// [`tag_hash`] of the entry's tag (of `b""` when it has none), so never
    /// 0 when given. Written in bytes every earlier writer left zero, so
    /// older files read as 0 = unknown (see docs/format.md).
    pub tag_hash: u32,
}

/// The tag hash stored in the index: [`key_hash`] of the tag's bytes (an
/// entry without a tag hashes the empty tag), so a writer that knows the
/// tag never stores 0, which means "unknown" (data written before the field
/// existed). Equal hashes may still be different tags: a reader that must
/// be exact reads the entry.
pub fn tag_hash(tag: Option<&[u8]>) -> u32 {
    key_hash(tag.unwrap_or(b""))
}

/// The key hash stored in the index for a message key: CRC-32 of the key
/// bytes, with 0 (which means "no key") mapped to 1. One function, so that
/// writers and lookups agree.
pub fn key_hash(key: &[u8]) -> u32 {
    match crc(&[key]) {
        0 => 1,
        h => h,
    }
}

/// The 48-byte header of one record inside a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    /// CRC-32 of header bytes [4, 48) followed by the body.
    pub crc: u32,
    pub kind: u8,
    pub body_len: u32,
    pub ledger: u64,
    pub entry: u64,
    pub extras: IndexExtras,
}

impl RecordHeader {
    /// Writes the header for `body` into `out[..48]`, computing the checksum.
    /// Returns the checksum.
    pub fn encode(out: &mut [u8], kind: u8, ledger: u64, entry: u64, extras: IndexExtras, body_parts: &[&[u8]]) -> u32 {
        let body_len: usize = body_parts.iter().map(|p| p.len()).sum();
        let b = Self::encode_fields(out, kind, ledger, entry, extras, body_len);
        let mut h = crc32fast::Hasher::new();
        h.update(&b[4..]);
        for p in body_parts {
            h.update(p);
        }
        let c = h.finalize();
        wr(b, 0, &c.to_le_bytes());
        c
    }

    /// [`encode`](Self::encode) for a body of `body_len` bytes whose CRC-32
    /// is `body_crc`: the record's checksum is the header's combined with
    /// it, without reading the body. Returns the checksum.
    pub fn encode_with_body_crc(
        out: &mut [u8],
        kind: u8,
        ledger: u64,
        entry: u64,
        extras: IndexExtras,
        body_len: usize,
        body_crc: u32,
    ) -> u32 {
        let b = Self::encode_fields(out, kind, ledger, entry, extras, body_len);
        let mut h = crc32fast::Hasher::new();
        h.update(&b[4..]);
        h.combine(&crc32fast::Hasher::new_with_initial_len(body_crc, body_len as u64));
        let c = h.finalize();
        wr(b, 0, &c.to_le_bytes());
        c
    }

    /// Writes every field but the checksum into `out[..48]`.
    fn encode_fields(
        out: &mut [u8],
        kind: u8,
        ledger: u64,
        entry: u64,
        extras: IndexExtras,
        body_len: usize,
    ) -> &mut [u8] {
        assert!(out.len() >= RECORD_HEADER_BYTES);
        let b = &mut out[..RECORD_HEADER_BYTES];
        b.fill(0);
        b[4] = kind;
        wr(b, 8, &(u32::try_from(body_len).expect("body length checked at append")).to_le_bytes());
        wr(b, 12, &extras.key_hash.to_le_bytes());
        wr(b, 16, &ledger.to_le_bytes());
        wr(b, 24, &entry.to_le_bytes());
        wr(b, 32, &extras.publish_time_ms.to_le_bytes());
        wr(b, 40, &extras.tag_hash.to_le_bytes());
        b
    }

    /// Decodes without verifying the checksum (see [`RecordHeader::verify`]).
    pub fn decode(b: &[u8]) -> Result<RecordHeader, CorruptReason> {
        assert!(b.len() >= RECORD_HEADER_BYTES);
        let kind = b[4];
        if !matches!(kind, KIND_ENTRY | KIND_META | KIND_DELETE | KIND_MOVE) {
            return Err(CorruptReason::Field { field: "record kind", expected: KIND_ENTRY as u64, found: kind as u64 });
        }
        Ok(RecordHeader {
            crc: rd_u32(b, 0),
            kind,
            body_len: rd_u32(b, 8),
            ledger: rd_u64(b, 16),
            entry: rd_u64(b, 24),
            extras: IndexExtras { key_hash: rd_u32(b, 12), publish_time_ms: rd_u64(b, 32), tag_hash: rd_u32(b, 40) },
        })
    }

    /// Verifies the record checksum over `header_bytes[4..48]` and `body`.
    pub fn verify(&self, header_bytes: &[u8], body: &[u8]) -> Result<(), CorruptReason> {
        let computed = crc(&[&header_bytes[4..RECORD_HEADER_BYTES], body]);
        if computed != self.crc {
            return Err(CorruptReason::RecordCrc { stored: self.crc, computed });
        }
        Ok(())
    }
}

/// One record of a batch whose checksums passed, as [`records`] yields it.
#[derive(Debug, Clone, Copy)]
pub struct RecordRef<'a> {
    /// Offset of the record header from the start of the batch.
    pub offset: usize,
    pub header: RecordHeader,
    pub body: &'a [u8],
}

/// Iterator over the records of a batch; see [`records`].
#[derive(Debug)]
pub struct Records<'a> {
    b: &'a [u8],
    records_end: usize,
    off: usize,
    left: u32,
    done: bool,
}

/// Walks the records of a batch (`b` from the batch header on, whose header
/// and body checksums passed), checking each record's bounds, kind and
/// checksum, and at the end that the records fill exactly `records_len`.
/// An error carries the offset (from the batch start) where it was found and
/// ends the walk. Recovery and the offline inspector both read batches
/// through this, so they accept and reject exactly the same bytes.
pub fn records<'a>(h: &BatchHeader, b: &'a [u8]) -> Records<'a> {
    let records_end = (BATCH_HEADER_BYTES + h.records_len as usize).min(b.len());
    Records { b, records_end, off: BATCH_HEADER_BYTES, left: h.record_count, done: false }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<RecordRef<'a>, (usize, CorruptReason)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let o = self.off;
        if self.left == 0 {
            self.done = true;
            if o != self.records_end {
                return Some(Err((
                    o,
                    CorruptReason::Field {
                        field: "records length",
                        expected: (self.records_end - BATCH_HEADER_BYTES) as u64,
                        found: (o - BATCH_HEADER_BYTES) as u64,
                    },
                )));
            }
            return None;
        }
        let fail = |me: &mut Self, r: CorruptReason| {
            me.done = true;
            Some(Err((o, r)))
        };
        if o + RECORD_HEADER_BYTES > self.records_end {
            let limit = (self.records_end - o) as u64;
            return fail(self, CorruptReason::Length { len: RECORD_HEADER_BYTES as u64, limit });
        }
        let hdr = &self.b[o..o + RECORD_HEADER_BYTES];
        let rh = match RecordHeader::decode(hdr) {
            Ok(h) => h,
            Err(r) => return fail(self, r),
        };
        let end = o + RECORD_HEADER_BYTES + rh.body_len as usize;
        if end > self.records_end {
            let limit = (self.records_end - o - RECORD_HEADER_BYTES) as u64;
            return fail(self, CorruptReason::Length { len: rh.body_len as u64, limit });
        }
        let body = &self.b[o + RECORD_HEADER_BYTES..end];
        if let Err(r) = rh.verify(hdr, body) {
            return fail(self, r);
        }
        self.off = end;
        self.left -= 1;
        Some(Ok(RecordRef { offset: o, header: rh, body }))
    }
}

/// Checks one entry record read back from disk (`raw` = record header and
/// body) against what the index says of it: checksum, kind (an entry or a
/// relocated copy of one), ledger, entry id, length. Shared by reads in the
/// broker, compaction and the offline inspector.
pub fn check_entry_record(raw: &[u8], ie: &IndexEntry, ledger: u64, entry: u64) -> Result<RecordHeader, CorruptReason> {
    let len = RECORD_HEADER_BYTES + ie.body_len as usize;
    if raw.len() < len {
        return Err(CorruptReason::ShortFile { len: raw.len() as u64, need: len as u64 });
    }
    let h = RecordHeader::decode(raw)?;
    h.verify(raw, &raw[RECORD_HEADER_BYTES..len])?;
    let kind = if h.kind == KIND_MOVE { KIND_MOVE } else { KIND_ENTRY };
    for (field, expected, found) in [
        ("record crc", ie.record_crc as u64, h.crc as u64),
        ("record kind", kind as u64, h.kind as u64),
        ("record ledger", ledger, h.ledger),
        ("record entry", entry, h.entry),
        ("record length", ie.body_len as u64, h.body_len as u64),
    ] {
        if expected != found {
            return Err(CorruptReason::Field { field, expected, found });
        }
    }
    Ok(h)
}

/// Splits a metadata record body `key_len u16 | key | value`.
pub fn split_meta(body: &[u8]) -> Result<(&[u8], &[u8]), CorruptReason> {
    if body.len() < 2 {
        return Err(CorruptReason::Length { len: 2, limit: body.len() as u64 });
    }
    let klen = rd_u16(body, 0) as usize;
    if 2 + klen > body.len() {
        return Err(CorruptReason::Length { len: klen as u64, limit: body.len() as u64 - 2 });
    }
    Ok((&body[2..2 + klen], &body[2 + klen..]))
}

// ---------------------------------------------------------------- index pages

/// One fixed-size index entry: where an entry's record lives, and its extras.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// Log position of the record header.
    pub position: u64,
    pub body_len: u32,
    pub record_crc: u32,
    pub extras: IndexExtras,
}

/// Encodes one index page holding `entries` (1..=127) starting at `first_entry`.
pub fn encode_index_page(ledger: u64, first_entry: u64, entries: &[IndexEntry]) -> Vec<u8> {
    assert!(!entries.is_empty() && entries.len() <= INDEX_ENTRIES_PER_PAGE);
    let mut p = vec![0u8; PAGE_BYTES as usize];
    wr(&mut p, 0, &INDEX_MAGIC);
    wr(&mut p, 8, &ledger.to_le_bytes());
    wr(&mut p, 16, &first_entry.to_le_bytes());
    wr(&mut p, 24, &(entries.len() as u32).to_le_bytes());
    wr(&mut p, 28, &FORMAT_VERSION.to_le_bytes());
    for (i, e) in entries.iter().enumerate() {
        let o = INDEX_PAGE_HEADER_BYTES + i * INDEX_ENTRY_BYTES;
        wr(&mut p, o, &e.position.to_le_bytes());
        wr(&mut p, o + 8, &e.body_len.to_le_bytes());
        wr(&mut p, o + 12, &e.record_crc.to_le_bytes());
        wr(&mut p, o + 16, &e.extras.publish_time_ms.to_le_bytes());
        wr(&mut p, o + 24, &e.extras.key_hash.to_le_bytes());
        wr(&mut p, o + 28, &e.extras.tag_hash.to_le_bytes());
    }
    let c = crc(&[&p[8..]]);
    wr(&mut p, 4, &c.to_le_bytes());
    p
}

/// Decodes and verifies one index page; returns (first_entry, entries).
pub fn decode_index_page(p: &[u8], ledger: u64) -> Result<(u64, Vec<IndexEntry>), CorruptReason> {
    assert!(p.len() >= PAGE_BYTES as usize);
    let p = &p[..PAGE_BYTES as usize];
    if p[0..4] != INDEX_MAGIC {
        return Err(CorruptReason::BadMagic);
    }
    let stored = rd_u32(p, 4);
    let computed = crc(&[&p[8..]]);
    if stored != computed {
        return Err(CorruptReason::HeaderCrc { stored, computed });
    }
    let found = rd_u64(p, 8);
    if found != ledger {
        return Err(CorruptReason::Field { field: "index page ledger", expected: ledger, found });
    }
    let version = rd_u16(p, 28);
    if version != FORMAT_VERSION {
        return Err(CorruptReason::Version(version));
    }
    let first = rd_u64(p, 16);
    let count = rd_u32(p, 24) as usize;
    if count == 0 || count > INDEX_ENTRIES_PER_PAGE {
        return Err(CorruptReason::Field {
            field: "index page count",
            expected: INDEX_ENTRIES_PER_PAGE as u64,
            found: count as u64,
        });
    }
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let o = INDEX_PAGE_HEADER_BYTES + i * INDEX_ENTRY_BYTES;
        out.push(IndexEntry {
            position: rd_u64(p, o),
            body_len: rd_u32(p, o + 8),
            record_crc: rd_u32(p, o + 12),
            extras: IndexExtras {
                publish_time_ms: rd_u64(p, o + 16),
                key_hash: rd_u32(p, o + 24),
                tag_hash: rd_u32(p, o + 28),
            },
        });
    }
    Ok((first, out))
}

// ---------------------------------------------------------------- checkpoint

/// Per-ledger line of a checkpoint: how much of its index file is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointLedger {
    pub ledger: u64,
    /// Entries 0..indexed_entries are in the index file.
    pub indexed_entries: u64,
    /// Pages 0..pages of the index file hold them.
    pub pages: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub ckpt_seq: u64,
    /// Log position up to which index files and the metadata snapshot are complete.
    pub position: u64,
    /// Sequence number of the batch at `position`.
    pub next_batch_seq: u64,
    pub ledgers: Vec<CheckpointLedger>,
    pub meta: Vec<(Vec<u8>, Vec<u8>)>,
    /// Entries whose record compaction moved after their index page was
    /// written: the index file keeps the old position (pages are never
    /// rewritten), this table the current one. Version 2 only.
    pub relocations: Vec<Relocation>,
}

/// One line of a checkpoint's relocation table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Relocation {
    pub ledger: u64,
    pub entry: u64,
    /// Log position of the [`KIND_MOVE`] record now holding the entry.
    pub position: u64,
    /// Its record checksum (differs from the original's: the kind differs).
    pub record_crc: u32,
}

impl Checkpoint {
    /// Encodes to a whole number of pages.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; CHECKPOINT_HEADER_BYTES];
        for l in &self.ledgers {
            b.extend_from_slice(&l.ledger.to_le_bytes());
            b.extend_from_slice(&l.indexed_entries.to_le_bytes());
            b.extend_from_slice(&l.pages.to_le_bytes());
        }
        for (k, v) in &self.meta {
            b.extend_from_slice(&(k.len() as u32).to_le_bytes());
            b.extend_from_slice(&(v.len() as u32).to_le_bytes());
            b.extend_from_slice(k);
            b.extend_from_slice(v);
        }
        b.extend_from_slice(&(self.relocations.len() as u64).to_le_bytes());
        for r in &self.relocations {
            b.extend_from_slice(&r.ledger.to_le_bytes());
            b.extend_from_slice(&r.entry.to_le_bytes());
            b.extend_from_slice(&r.position.to_le_bytes());
            b.extend_from_slice(&r.record_crc.to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
        }
        let content_len = b.len() as u64;
        wr(&mut b, 0, &CHECKPOINT_MAGIC);
        wr(&mut b, 12, &CHECKPOINT_VERSION.to_le_bytes());
        wr(&mut b, 16, &content_len.to_le_bytes());
        wr(&mut b, 24, &self.ckpt_seq.to_le_bytes());
        wr(&mut b, 32, &self.position.to_le_bytes());
        wr(&mut b, 40, &self.next_batch_seq.to_le_bytes());
        wr(&mut b, 48, &(self.ledgers.len() as u64).to_le_bytes());
        wr(&mut b, 56, &(self.meta.len() as u64).to_le_bytes());
        let c = crc(&[&b[12..]]);
        wr(&mut b, 8, &c.to_le_bytes());
        b.resize(pad_to_page(content_len) as usize, 0);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Checkpoint, CorruptReason> {
        if b.len() < CHECKPOINT_HEADER_BYTES {
            return Err(CorruptReason::ShortFile { len: b.len() as u64, need: CHECKPOINT_HEADER_BYTES as u64 });
        }
        if b[0..8] != CHECKPOINT_MAGIC {
            return Err(CorruptReason::BadMagic);
        }
        let content_len = rd_u64(b, 16);
        if content_len > b.len() as u64 || content_len < CHECKPOINT_HEADER_BYTES as u64 {
            return Err(CorruptReason::Length { len: content_len, limit: b.len() as u64 });
        }
        let b = &b[..content_len as usize];
        let stored = rd_u32(b, 8);
        let computed = crc(&[&b[12..]]);
        if stored != computed {
            return Err(CorruptReason::BodyCrc { stored, computed });
        }
        let version = rd_u16(b, 12);
        if !(1..=CHECKPOINT_VERSION).contains(&version) {
            return Err(CorruptReason::Version(version));
        }
        let nledgers = rd_u64(b, 48);
        let nmeta = rd_u64(b, 56);
        let mut off = CHECKPOINT_HEADER_BYTES;
        let too_short = |need: u64| CorruptReason::Length { len: need, limit: content_len };
        let ledger_bytes = nledgers.checked_mul(CHECKPOINT_LEDGER_BYTES as u64).ok_or(too_short(u64::MAX))?;
        if off as u64 + ledger_bytes > content_len {
            return Err(too_short(off as u64 + ledger_bytes));
        }
        let mut ledgers = Vec::with_capacity(nledgers as usize);
        for _ in 0..nledgers {
            ledgers.push(CheckpointLedger {
                ledger: rd_u64(b, off),
                indexed_entries: rd_u64(b, off + 8),
                pages: rd_u64(b, off + 16),
            });
            off += CHECKPOINT_LEDGER_BYTES;
        }
        let mut meta = Vec::new();
        for _ in 0..nmeta {
            if off + 8 > b.len() {
                return Err(too_short(off as u64 + 8));
            }
            let kl = rd_u32(b, off) as usize;
            let vl = rd_u32(b, off + 4) as usize;
            off += 8;
            if off + kl + vl > b.len() {
                return Err(too_short((off + kl + vl) as u64));
            }
            meta.push((b[off..off + kl].to_vec(), b[off + kl..off + kl + vl].to_vec()));
            off += kl + vl;
        }
        let mut relocations = Vec::new();
        if version >= 2 {
            if off + 8 > b.len() {
                return Err(too_short(off as u64 + 8));
            }
            let n = rd_u64(b, off);
            off += 8;
            let need = n.checked_mul(CHECKPOINT_RELOCATION_BYTES as u64).ok_or(too_short(u64::MAX))?;
            if off as u64 + need > content_len {
                return Err(too_short(off as u64 + need));
            }
            for _ in 0..n {
                relocations.push(Relocation {
                    ledger: rd_u64(b, off),
                    entry: rd_u64(b, off + 8),
                    position: rd_u64(b, off + 16),
                    record_crc: rd_u32(b, off + 24),
                });
                off += CHECKPOINT_RELOCATION_BYTES;
            }
        }
        if off != b.len() {
            return Err(CorruptReason::Field { field: "checkpoint length", expected: off as u64, found: content_len });
        }
        Ok(Checkpoint {
            ckpt_seq: rd_u64(b, 24),
            position: rd_u64(b, 32),
            next_batch_seq: rd_u64(b, 40),
            ledgers,
            meta,
            relocations,
        })
    }
}

/// The clean-shutdown marker: names the checkpoint written last at close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanMarker {
    pub ckpt_seq: u64,
    pub position: u64,
    pub next_batch_seq: u64,
}

impl CleanMarker {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; PAGE_BYTES as usize];
        wr(&mut b, 0, &CLEAN_MAGIC);
        wr(&mut b, 12, &FORMAT_VERSION.to_le_bytes());
        wr(&mut b, 16, &self.ckpt_seq.to_le_bytes());
        wr(&mut b, 24, &self.position.to_le_bytes());
        wr(&mut b, 32, &self.next_batch_seq.to_le_bytes());
        let c = crc(&[&b[12..CLEAN_BYTES]]);
        wr(&mut b, 8, &c.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<CleanMarker> {
        if b.len() < CLEAN_BYTES || b[0..8] != CLEAN_MAGIC {
            return None;
        }
        if rd_u32(b, 8) != crc(&[&b[12..CLEAN_BYTES]]) || rd_u16(b, 12) != FORMAT_VERSION {
            return None;
        }
        Some(CleanMarker { ckpt_seq: rd_u64(b, 16), position: rd_u64(b, 24), next_batch_seq: rd_u64(b, 32) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_header_round_trip_and_bit_flips() {
        // Goal: every single-bit flip in a header is rejected.
        let h = BatchHeader {
            batch_len: 8192,
            record_count: 3,
            seq: 7,
            position: 1 << 20,
            records_len: 500,
            body_crc: 0xdead_beef,
            flags: BATCH_FLAG_OVER_STALE,
            segment_len: 64 << 20,
        };
        let mut b = [0u8; BATCH_HEADER_BYTES];
        h.encode(&mut b);
        assert_eq!(BatchHeader::decode(&b), Ok(h));
        for bit in 0..BATCH_HEADER_BYTES * 8 {
            let mut c = b;
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(BatchHeader::decode(&c).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn body_crc_built_from_records_equals_the_checksum_of_the_bytes() {
        // Goal: `BodyCrc` gives the same checksum as hashing the whole body,
        // whatever mix of records below and above the combine threshold
        // precedes or follows, with and without padding; and a record header
        // built from its body's checksum is the one built from its bytes.
        let big = BODY_CRC_COMBINE_MIN;
        let shapes: &[&[usize]] = &[
            &[],
            &[0],
            &[big],
            &[big - 1, big, big + 1],
            &[3, 131_072, 0, 100, 20_000],
            &[big, big, 7, big * 3],
            &[1000; 9],
        ];
        for (n, shape) in shapes.iter().enumerate() {
            let records: usize = shape.iter().map(|b| RECORD_HEADER_BYTES + b).sum();
            for extra in [0, 1, 4095] {
                let len = pad_to_page((BATCH_HEADER_BYTES + records + extra) as u64) as usize;
                let mut batch = vec![0u8; len];
                let mut body_crc = BodyCrc::new();
                let mut off = BATCH_HEADER_BYTES;
                for (i, &body_len) in shape.iter().enumerate() {
                    let body: Vec<u8> = (0..body_len).map(|j| (j * 31 + i * 7 + n) as u8).collect();
                    let extras = IndexExtras { key_hash: 3, publish_time_ms: 1 << 40, tag_hash: 9 };
                    let rc = RecordHeader::encode(&mut batch[off..], KIND_ENTRY, 1, i as u64, extras, &[&body]);
                    let mut again = [0u8; RECORD_HEADER_BYTES];
                    let derived = RecordHeader::encode_with_body_crc(
                        &mut again,
                        KIND_ENTRY,
                        1,
                        i as u64,
                        extras,
                        body_len,
                        crc(&[&body]),
                    );
                    assert_eq!(
                        (derived, &again[..]),
                        (rc, &batch[off..off + RECORD_HEADER_BYTES]),
                        "from the body's crc"
                    );
                    batch[off + RECORD_HEADER_BYTES..off + RECORD_HEADER_BYTES + body_len].copy_from_slice(&body);
                    body_crc.record(&batch, off, rc, body_len);
                    off += RECORD_HEADER_BYTES + body_len;
                }
                assert_eq!(body_crc.finish(&batch), crc(&[&batch[BATCH_HEADER_BYTES..]]), "shape {shape:?}, len {len}");
            }
        }
    }

    #[test]
    fn checkpoint_round_trip() {
        let c = Checkpoint {
            ckpt_seq: 3,
            position: 4096 * 9,
            next_batch_seq: 9,
            ledgers: vec![CheckpointLedger { ledger: 5, indexed_entries: 300, pages: 3 }],
            meta: vec![(b"k".to_vec(), b"v".to_vec()), (b"x".to_vec(), vec![])],
            relocations: vec![Relocation { ledger: 5, entry: 7, position: 4096 * 8 + 64, record_crc: 9 }],
        };
        let b = c.encode();
        assert!((b.len() as u64).is_multiple_of(PAGE_BYTES));
        assert_eq!(Checkpoint::decode(&b), Ok(c));
        let mut bad = b.clone();
        bad[70] ^= 1;
        assert!(Checkpoint::decode(&bad).is_err());
    }

    #[test]
    fn index_page_round_trip() {
        let e: Vec<IndexEntry> = (0..127)
            .map(|i| IndexEntry {
                position: i * 100,
                body_len: i as u32,
                record_crc: 1,
                extras: IndexExtras { publish_time_ms: i, key_hash: 2, tag_hash: 3 },
            })
            .collect();
        let p = encode_index_page(9, 254, &e);
        assert_eq!(decode_index_page(&p, 9), Ok((254, e)));
        assert!(decode_index_page(&p, 8).is_err());
    }
}
