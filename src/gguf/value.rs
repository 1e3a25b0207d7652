//! GGUF metadata values: [`Value`] and the on-disk value type ids.
//!
//! A metadata value is stored as a `u32` type id followed by its payload, little-endian:
//!
//! | id | type   | payload |
//! |----|--------|---------|
//! | 0  | u8     | 1 byte |
//! | 1  | i8     | 1 byte |
//! | 2  | u16    | 2 bytes |
//! | 3  | i16    | 2 bytes |
//! | 4  | u32    | 4 bytes |
//! | 5  | i32    | 4 bytes |
//! | 6  | f32    | 4 bytes, IEEE binary32 |
//! | 7  | bool   | 1 byte, 0 or 1 |
//! | 8  | string | `len: u64`, then `len` bytes of UTF-8 (no terminator) |
//! | 9  | array  | element type id `u32`, `count: u64`, then `count` payloads of that type |
//! | 10 | u64    | 8 bytes |
//! | 11 | i64    | 8 bytes |
//! | 12 | f64    | 8 bytes, IEEE binary64 |
//!
//! Array elements all share one type; an element may itself be an array (each inner array
//! carries its own element type).
//!
//! [`Value`]'s `Display` writes the value itself, in full: numbers and bools as Rust
//! prints them, strings quoted and escaped, arrays as `[a, b, ...]`.

use std::fmt;

/// One metadata value. Arrays are homogeneous: every element has the same variant.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// Type 0.
    U8(u8),
    /// Type 1.
    I8(i8),
    /// Type 2.
    U16(u16),
    /// Type 3.
    I16(i16),
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 6.
    F32(f32),
    /// Type 7.
    Bool(bool),
    /// Type 8, UTF-8.
    Str(String),
    /// Type 9: elements of one type.
    Array(Vec<Value>),
    /// Type 10.
    U64(u64),
    /// Type 11.
    I64(i64),
    /// Type 12.
    F64(f64),
}

impl Value {
    /// The string, for [`Value::Str`].
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Any integer variant whose value is non-negative, widened to `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            _ => self.as_i64().and_then(|v| u64::try_from(v).ok()),
        }
    }

    /// Any integer variant whose value fits `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::I8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::U64(v) => i64::try_from(v).ok(),
            Value::I64(v) => Some(v),
            _ => None,
        }
    }

    /// [`Value::F32`], or [`Value::F64`] rounded to the nearest `f32`.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// The flag, for [`Value::Bool`].
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The elements, for [`Value::Array`].
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(v) => Some(v),
            _ => None,
        }
    }

    /// The GGUF name of the variant: `"u8"`, `"i8"`, `"u16"`, `"i16"`, `"u32"`, `"i32"`,
    /// `"f32"`, `"bool"`, `"string"`, `"array"`, `"u64"`, `"i64"`, `"f64"`.
    pub fn type_name(&self) -> &'static str {
        self.value_type().name()
    }

    /// The on-disk type of this value.
    pub(crate) fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::Str(_) => ValueType::Str,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            // `{:?}` of a float is its shortest round-trip form that still reads as a
            // float: `1e-5`, `100000.0` (where `{}` would write `0.00001`, `100000`).
            Value::F32(v) => write!(f, "{v:?}"),
            Value::F64(v) => write!(f, "{v:?}"),
            Value::Bool(v) => write!(f, "{v}"),
            // Quoted, with quotes, backslashes and control characters escaped: one line.
            Value::Str(s) => write!(f, "{s:?}"),
            Value::Array(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
        }
    }
}

/// The on-disk value type ids (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    Str = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    /// The type of an on-disk id, or `None` outside `0..=12`.
    pub(crate) fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => Str,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The on-disk id.
    pub(crate) fn id(self) -> u32 {
        self as u32
    }

    /// The fewest bytes a payload of this type can occupy: the fixed size of a number, the
    /// length prefix of an empty string, the header of an empty array. Counts are checked
    /// against `count × min_size` before anything is allocated.
    pub(crate) fn min_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | Str => 8,
            Array => 12,
        }
    }

    /// The GGUF name (see [`Value::type_name`]).
    pub(crate) fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            Str => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Value;

    #[test]
    fn display_writes_the_value_not_the_variant() {
        let cases = [
            (Value::U32(30), "30"),
            (Value::I8(-3), "-3"),
            (Value::U64(u64::MAX), "18446744073709551615"),
            (Value::F32(1e-5), "1e-5"),
            (Value::F32(100000.0), "100000.0"),
            (Value::F64(-0.5), "-0.5"),
            (Value::Bool(false), "false"),
            (Value::Str("say \"hi\"\n".into()), r#""say \"hi\"\n""#),
            (Value::Array(vec![Value::U32(3), Value::U32(4)]), "[3, 4]"),
            (Value::Array(vec![]), "[]"),
            (
                Value::Array(vec![
                    Value::Array(vec![Value::Str("a".into())]),
                    Value::Array(vec![]),
                ]),
                r#"[["a"], []]"#,
            ),
        ];
        for (value, want) in cases {
            assert_eq!(value.to_string(), want, "{value:?}");
        }
    }
}
