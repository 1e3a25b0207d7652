//! The GPT-2 byte-to-unicode map used by byte-level BPE vocabularies.
//!
//! Byte-level BPE works on bytes, but its vocabulary is stored as text: each byte `b` is
//! written as one printable code point. The 188 bytes that are already printable and not
//! whitespace (`'!'..='~'`, `'¡'..='¬'`, `'®'..='ÿ'`) stand for themselves; the remaining 68
//! bytes, in increasing order, map to `U+0100`, `U+0101`, ... (so a space `0x20` is `Ġ`,
//! `U+0120`, and a newline `0x0A` is `Ċ`, `U+010A`). Token `"Ġthe"` is therefore the bytes
//! `" the"`. The map is a bijection between the 256 bytes and 256 code points below `U+0144`.

/// Number of code points the map covers: every image is below `U+0100 + 68 = U+0144`.
const CODE_POINT_LIMIT: usize = 0x144;

/// Whether byte `b` stands for itself in the GPT-2 map.
fn is_self_mapped(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The GPT-2 byte ↔ code point bijection, as two lookup tables.
#[derive(Debug, Clone)]
pub(crate) struct ByteMap {
    /// `to_char[b]`: the code point that stands for byte `b`.
    to_char: [char; 256],
    /// `to_byte[c]`: the byte that code point `c` stands for, for `c < CODE_POINT_LIMIT`.
    to_byte: [Option<u8>; CODE_POINT_LIMIT],
}

impl ByteMap {
    /// Builds both tables.
    pub(crate) fn new() -> ByteMap {
        let mut to_char = ['\0'; 256];
        let mut to_byte = [None; CODE_POINT_LIMIT];
        let mut next_shifted = 0x100u32;
        for b in 0..=255u8 {
            let cp = if is_self_mapped(b) {
                u32::from(b)
            } else {
                next_shifted += 1;
                next_shifted - 1
            };
            let c = char::from_u32(cp).expect("code points below U+0144 are valid chars");
            to_char[usize::from(b)] = c;
            to_byte[cp as usize] = Some(b);
        }
        ByteMap { to_char, to_byte }
    }

    /// The code point standing for byte `b`.
    pub(crate) fn char_of(&self, b: u8) -> char {
        self.to_char[usize::from(b)]
    }

    /// The byte that `c` stands for, or `None` if `c` is not in the map's image.
    pub(crate) fn byte_of(&self, c: char) -> Option<u8> {
        self.to_byte.get(c as usize).copied().flatten()
    }

    /// Encodes raw bytes into their byte-level text form (`" the"` → `"Ġthe"`).
    pub(crate) fn encode(&self, bytes: &[u8]) -> String {
        bytes.iter().map(|&b| self.char_of(b)).collect()
    }

    /// Decodes a vocabulary string into the bytes it stands for. A code point outside the
    /// map's image (which a well-formed byte-level vocabulary never contains) is kept as
    /// its own UTF-8 bytes, so no text is lost.
    pub(crate) fn decode(&self, text: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(text.len());
        for c in text.chars() {
            match self.byte_of(c) {
                Some(b) => out.push(b),
                None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_is_a_bijection_with_known_anchors() {
        let m = ByteMap::new();
        assert_eq!(m.char_of(b' '), 'Ġ');
        assert_eq!(m.char_of(b'\n'), 'Ċ');
        assert_eq!(m.char_of(b'a'), 'a');
        assert_eq!(m.char_of(0xAD), '\u{143}');
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = m.char_of(b);
            assert!(seen.insert(c), "byte {b} maps to a repeated char");
            assert_eq!(m.byte_of(c), Some(b));
        }
        assert_eq!(m.byte_of('\u{144}'), None);
        assert_eq!(m.decode(&m.encode(b"\x00 hi\xff")), b"\x00 hi\xff");
    }
}
