//! Disk watermarks: the shard watches how full its data disk is, warns at
//! the warning levels (75 % and 85 % by default), and at the refusal level
//! (90 % by default) refuses produce requests with the retriable
//! `StorageFull` error while consumers keep reading; it resumes by itself
//! once usage is back below the refusal level (e.g. after retention or an
//! operator freed space).
//!
//! How full the disk is comes from a [`DiskUsageFn`]: `statvfs` of the data
//! directory by default, or an injected function (tests; a future namespace
//! quota could plug in here as well).

use std::path::Path;
use std::sync::Arc;

/// Returns `(used_bytes, total_bytes)` of the filesystem holding `path`.
pub type DiskUsageFn = Arc<dyn Fn(&Path) -> std::io::Result<(u64, u64)> + Send + Sync>;

/// The watermark settings and the usage source. Immutable, shared by all shards.
#[derive(Clone)]
pub struct DiskWatermarks {
    /// Percentages at which a warning is logged when usage rises past them.
    pub warn_pcts: Vec<u8>,
    /// At or above this percentage, produce requests are refused.
    pub refuse_pct: u8,
    /// How often usage is measured.
    pub check_interval: std::time::Duration,
    /// Where usage comes from; `None` = `statvfs` of the data directory.
    pub usage: Option<DiskUsageFn>,
}

impl std::fmt::Debug for DiskWatermarks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskWatermarks")
            .field("warn_pcts", &self.warn_pcts)
            .field("refuse_pct", &self.refuse_pct)
            .field("check_interval", &self.check_interval)
            .field("usage", &self.usage.as_ref().map(|_| "custom"))
            .finish()
    }
}

impl Default for DiskWatermarks {
    fn default() -> Self {
        Self { warn_pcts: vec![75, 85], refuse_pct: 90, check_interval: std::time::Duration::from_secs(1), usage: None }
    }
}

/// `statvfs(2)` of `path`, as `df` counts it: used bytes, and used plus
/// available-to-unprivileged bytes as the total (blocks reserved for root,
/// and space the filesystem cannot give out, count in neither), so the
/// percentage is `df`'s Use%.
pub fn statvfs_usage(path: &Path) -> std::io::Result<(u64, u64)> {
    let s = nix::sys::statvfs::statvfs(path).map_err(std::io::Error::from)?;
    let frag = s.fragment_size() as u64;
    let used = (s.blocks() as u64).saturating_sub(s.blocks_free() as u64).saturating_mul(frag);
    let avail = (s.blocks_available() as u64).saturating_mul(frag);
    Ok((used, used.saturating_add(avail)))
}

impl DiskWatermarks {
    /// Percentage of the disk in use (0..=100), rounded down.
    pub fn measure(&self, path: &Path) -> std::io::Result<u8> {
        let (used, total) = match &self.usage {
            Some(f) => f(path)?,
            None => statvfs_usage(path)?,
        };
        if total == 0 {
            return Ok(0);
        }
        Ok(((used as u128 * 100 / total as u128).min(100)) as u8)
    }
}
