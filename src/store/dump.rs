//! A hash in the form `DUMP` gives and `RESTORE` takes ([`hash_payload`]), for the importer:
//! Redis builds a hash it loads this way as a listpack in one pass, where `HSET` looks for
//! every new field in the whole listpack first (a week of minutes, 10 080 fields, took about a
//! second of Redis's CPU a hash field by field).
//!
//! The form is Redis's RDB encoding of one value: the type (`RDB_TYPE_HASH`, 4), the number of
//! pairs, each field and value as a length-prefixed string, then the RDB version (2 bytes,
//! little-endian) and the CRC-64 of all of it (Jones' polynomial, reflected, as Redis's
//! `crc64.c`; 8 bytes, little-endian).

/// `RDB_TYPE_HASH`: a hash as field, value pairs.
const RDB_TYPE_HASH: u8 = 4;

/// The RDB version the payload claims: Redis 6.2's; `RESTORE` takes any version up to its own.
const RDB_VERSION: u16 = 9;

/// The payload of a hash of `pairs`, for `RESTORE key 0 <payload>`.
pub fn hash_payload<F: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &[(F, V)]) -> Vec<u8> {
    let mut out = vec![RDB_TYPE_HASH];
    length(&mut out, pairs.len() as u64);
    for (field, value) in pairs {
        string(&mut out, field.as_ref());
        string(&mut out, value.as_ref());
    }
    out.extend_from_slice(&RDB_VERSION.to_le_bytes());
    let crc = crc64(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// RDB's length: 6 bits, 14 bits, or a marker and 32 or 64 bits, big-endian.
fn length(out: &mut Vec<u8>, n: u64) {
    if n < 1 << 6 {
        out.push(n as u8);
    } else if n < 1 << 14 {
        out.extend_from_slice(&[0x40 | (n >> 8) as u8, n as u8]);
    } else if n <= u64::from(u32::MAX) {
        out.push(0x80);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    } else {
        out.push(0x81);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

fn string(out: &mut Vec<u8>, bytes: &[u8]) {
    length(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// CRC-64/Jones as Redis computes it (CRC-64/REDIS: reflected polynomial 0x95ac9329ac4bc9b5,
/// initial value 0, no final xor).
fn crc64(bytes: &[u8]) -> u64 {
    const TABLE: [u64; 256] = {
        let mut table = [0u64; 256];
        let mut i = 0;
        while i < 256 {
            let mut crc = i as u64;
            let mut bit = 0;
            while bit < 8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0x95ac_9329_ac4b_c9b5
                } else {
                    crc >> 1
                };
                bit += 1;
            }
            table[i] = crc;
            i += 1;
        }
        table
    };
    bytes.iter().fold(0u64, |crc, &b| {
        TABLE[((crc ^ u64::from(b)) & 0xff) as usize] ^ (crc >> 8)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc64_is_redis_s() {
        // crc64.c's own test vector.
        assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
    }

    #[test]
    fn lengths_in_each_width() {
        let encoded = |n| {
            let mut out = Vec::new();
            length(&mut out, n);
            out
        };
        assert_eq!(encoded(63), [63]);
        assert_eq!(encoded(64), [0x40, 64]);
        assert_eq!(encoded(10_080), [0x40 | 0x27, 0x60]);
        assert_eq!(encoded(16_384), [0x80, 0, 0, 0x40, 0]);
    }
}
