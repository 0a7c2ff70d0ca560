//! Reading text eight bytes at a time: the searches of the renderer's hot loops (a
//! string's end in an object's JSON text, the next newline or marker in rendered
//! output) look at one `u64` word per step instead of one byte.

/// The bytes of `word` equal to `byte`, as their high bits. Exact for the lowest
/// matching byte (a byte after a match may be flagged too); zero when none matches.
/// With the word read little-endian, the lowest flagged byte is the first match.
pub(super) fn equal_bytes(word: u64, byte: u8) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zeroed = word ^ (ONES * u64::from(byte));
    zeroed.wrapping_sub(ONES) & !zeroed & HIGH
}
