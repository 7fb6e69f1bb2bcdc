//! Maps keyed by [`TaskId`], with a hasher made for ids this process drew at random.

use std::collections::HashMap;

use forkhive_core::TaskId;

/// Hashes [`TaskId`]s, which are already 64 random bits drawn by this process: a multiply-xor
/// fold of the bytes is enough, and several times cheaper than SipHash on the registry's and
/// the task service's hot paths. (Keys are ids the crate generated, never attacker-chosen.)
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word))
                .wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    /// Mixes the high bits into the low ones (murmur3's finaliser): the table picks buckets by
    /// the low bits, and ids made from sequential entropy (`TaskId::from_entropy`, tests,
    /// replays) differ only in their high bytes.
    fn finish(&self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

/// A map keyed by task id, hashed with [`IdHasher`].
pub(crate) type IdMap<V> = HashMap<TaskId, V, std::hash::BuildHasherDefault<IdHasher>>;
