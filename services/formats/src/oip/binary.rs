//! The binary tensor extension: a tensor's elements little-endian in the body after the JSON
//! header, BYTES each with a 4-byte length, FP16 as IEEE 754 half precision.

use super::{BINARY_DATA_SIZE, Data, DataType, Tensor, refuse};
use crate::Result;

/// Takes `len` bytes off the front of `binary`.
pub(super) fn take<'a>(binary: &mut &'a [u8], len: usize, what: &str) -> Result<&'a [u8]> {
    if len > binary.len() {
        return Err(refuse(format!(
            "{what}: {BINARY_DATA_SIZE} {len} runs past the end of the body ({} bytes left)",
            binary.len()
        )));
    }
    let (head, rest) = binary.split_at(len);
    *binary = rest;
    Ok(head)
}

pub(super) fn from_binary(datatype: DataType, bytes: &[u8], elements: u64, what: &str) -> Result<Data> {
    let Some(width) = datatype.width() else {
        let mut rest = bytes;
        let mut items = Vec::new();
        while !rest.is_empty() {
            if items.len() as u64 == elements {
                return Err(refuse(format!("{what}: more BYTES elements than its shape")));
            }
            let prefix = take(&mut rest, 4, what)?;
            let len = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
            items.push(take(&mut rest, len, what)?.to_vec());
        }
        return Ok(Data::Bytes(items));
    };
    if bytes.len() as u64 != elements.saturating_mul(width as u64) {
        return Err(refuse(format!(
            "{what}: {BINARY_DATA_SIZE} is {} bytes, but {elements} {} elements take {}",
            bytes.len(),
            datatype.name(),
            elements.saturating_mul(width as u64)
        )));
    }
    let chunks = bytes.chunks_exact(width);
    let le = |chunk: &[u8]| {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        u64::from_le_bytes(word)
    };
    Ok(match datatype {
        DataType::Bool => Data::Bool(chunks.map(|chunk| chunk[0] != 0).collect()),
        DataType::Uint8 | DataType::Uint16 | DataType::Uint32 | DataType::Uint64 => {
            Data::Int(chunks.map(|chunk| i128::from(le(chunk))).collect())
        }
        DataType::Int8 => Data::Int(chunks.map(|chunk| i128::from(chunk[0] as i8)).collect()),
        DataType::Int16 => Data::Int(chunks.map(|chunk| i128::from(le(chunk) as u16 as i16)).collect()),
        DataType::Int32 => Data::Int(chunks.map(|chunk| i128::from(le(chunk) as u32 as i32)).collect()),
        DataType::Int64 => Data::Int(chunks.map(|chunk| i128::from(le(chunk) as i64)).collect()),
        DataType::Fp16 => Data::Float(chunks.map(|chunk| f16_to_f64(le(chunk) as u16)).collect()),
        DataType::Fp32 => Data::Float(
            chunks
                .map(|chunk| f64::from(f32::from_bits(le(chunk) as u32)))
                .collect(),
        ),
        DataType::Fp64 => Data::Float(chunks.map(|chunk| f64::from_bits(le(chunk))).collect()),
        DataType::Bytes => unreachable!("BYTES has no width"),
    })
}

/// An IEEE 754 half-precision value.
pub(super) fn f16_to_f64(bits: u16) -> f64 {
    let sign = if bits >> 15 == 1 { -1.0 } else { 1.0 };
    let exponent = i32::from((bits >> 10) & 0x1f);
    let fraction = f64::from(bits & 0x3ff);
    sign * match exponent {
        0 => fraction * 2f64.powi(-24),
        31 if fraction == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        _ => (1.0 + fraction / 1024.0) * 2f64.powi(exponent - 15),
    }
}

/// The nearest half-precision value (ties to even), for writing FP16.
pub(super) fn f64_to_f16(value: f64) -> u16 {
    let sign: u16 = if value.is_sign_negative() { 0x8000 } else { 0 };
    let magnitude = value.abs();
    if magnitude.is_nan() {
        return sign | 0x7e00;
    }
    if magnitude >= 65520.0 {
        return sign | 0x7c00;
    }
    if magnitude < 2f64.powi(-14) {
        // Subnormal: multiples of 2^-24.
        return sign | (magnitude * 2f64.powi(24)).round_ties_even() as u16;
    }
    let mut exponent = magnitude.log2().floor() as i32;
    // log2 may round across a power of two: put the exponent where the magnitude is.
    if magnitude < 2f64.powi(exponent) {
        exponent -= 1;
    } else if magnitude >= 2f64.powi(exponent + 1) {
        exponent += 1;
    }
    let mut fraction = (magnitude / 2f64.powi(exponent) - 1.0) * 1024.0;
    fraction = fraction.round_ties_even();
    let (exponent, fraction) = if fraction >= 1024.0 {
        (exponent + 1, 0.0)
    } else {
        (exponent, fraction)
    };
    sign | (((exponent + 15) as u16) << 10) | fraction as u16
}

pub(super) fn to_binary(tensor: &Tensor) -> Vec<u8> {
    let mut out = Vec::new();
    let width = tensor.datatype.width().unwrap_or(0);
    match &tensor.data {
        Data::Bool(values) => out.extend(values.iter().map(|value| u8::from(*value))),
        Data::Int(values) => {
            for value in values {
                out.extend_from_slice(&(*value as u64).to_le_bytes()[..width]);
            }
        }
        Data::Float(values) => {
            for value in values {
                match tensor.datatype {
                    DataType::Fp16 => out.extend_from_slice(&f64_to_f16(*value).to_le_bytes()),
                    DataType::Fp32 => out.extend_from_slice(&(*value as f32).to_le_bytes()),
                    _ => out.extend_from_slice(&value.to_le_bytes()),
                }
            }
        }
        Data::Bytes(values) => {
            for value in values {
                out.extend_from_slice(&(value.len() as u32).to_le_bytes());
                out.extend_from_slice(value);
            }
        }
    }
    out
}
