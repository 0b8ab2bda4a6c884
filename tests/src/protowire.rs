//! A protobuf wire-format reader that knows no schema: it walks a message's
//! fields by number, so a test can check what a client encodes against a
//! published `.proto` without sharing the client's generated types.
//! Everything is checked: truncation, varints past 10 bytes, groups
//! (deprecated, never used by the schemas under test), field number 0.

/// One field's value as the wire carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 1.
    Fixed64(u64),
    /// Wire type 2: bytes, a string, an embedded message or a packed array.
    Bytes(&'a [u8]),
    /// Wire type 5.
    Fixed32(u32),
}

impl Value<'_> {
    pub fn wire_type(&self) -> u8 {
        match self {
            Value::Varint(_) => 0,
            Value::Fixed64(_) => 1,
            Value::Bytes(_) => 2,
            Value::Fixed32(_) => 5,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field<'a> {
    pub number: u32,
    pub value: Value<'a>,
}

/// Every field of `message`, in wire order.
pub fn fields(message: &[u8]) -> Result<Vec<Field<'_>>, String> {
    let mut fields = Vec::new();
    let mut at = 0;
    while at < message.len() {
        let key = varint(message, &mut at)?;
        let number = u32::try_from(key >> 3).map_err(|_| format!("field number {} too large", key >> 3))?;
        if number == 0 {
            return Err(format!("field number 0 at byte {at}"));
        }
        let value = match key & 7 {
            0 => Value::Varint(varint(message, &mut at)?),
            1 => Value::Fixed64(u64::from_le_bytes(
                take(message, &mut at, 8)?.try_into().map_err(|_| "fixed64")?,
            )),
            2 => {
                let length = varint(message, &mut at)?;
                let length = usize::try_from(length).map_err(|_| format!("length {length} too large"))?;
                Value::Bytes(take(message, &mut at, length)?)
            }
            5 => Value::Fixed32(u32::from_le_bytes(
                take(message, &mut at, 4)?.try_into().map_err(|_| "fixed32")?,
            )),
            other => return Err(format!("field {number}: wire type {other} (groups or invalid)")),
        };
        fields.push(Field { number, value });
    }
    Ok(fields)
}

fn take<'a>(message: &'a [u8], at: &mut usize, length: usize) -> Result<&'a [u8], String> {
    let end = at
        .checked_add(length)
        .filter(|end| *end <= message.len())
        .ok_or_else(|| format!("{length} bytes at byte {at}, past the end ({})", message.len()))?;
    let bytes = &message[*at..end];
    *at = end;
    Ok(bytes)
}

fn varint(message: &[u8], at: &mut usize) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in 0..10 {
        let byte = *message
            .get(*at)
            .ok_or_else(|| format!("a varint cut at byte {at}"))?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << (shift * 7);
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(format!("a varint longer than 10 bytes before byte {at}"))
}

/// A message's fields checked against a schema's field numbers: each field
/// has one of the `allowed` (number, wire type) pairs, and repeats only if
/// `repeated` lists it. Returns the fields.
pub fn checked<'a>(what: &str, message: &'a [u8], allowed: &[(u32, u8)], repeated: &[u32]) -> Vec<Field<'a>> {
    let fields = fields(message).unwrap_or_else(|err| panic!("expected {what} as valid protobuf: {err}"));
    for field in &fields {
        assert!(
            allowed.contains(&(field.number, field.value.wire_type())),
            "expected {what} to have only fields (number, wire type) {allowed:?}, got field {} of wire type {}",
            field.number,
            field.value.wire_type()
        );
        let times = fields.iter().filter(|other| other.number == field.number).count();
        assert!(
            times == 1 || repeated.contains(&field.number),
            "expected {what}'s singular field {} once, got it {times} times",
            field.number
        );
    }
    fields
}

/// The length-delimited values of field `number`.
pub fn bytes_of<'a>(fields: &[Field<'a>], number: u32) -> Vec<&'a [u8]> {
    fields
        .iter()
        .filter(|field| field.number == number)
        .filter_map(|field| match field.value {
            Value::Bytes(bytes) => Some(bytes),
            _ => None,
        })
        .collect()
}

/// The varint value of field `number`, 0 when absent (proto3's default).
pub fn varint_of(fields: &[Field<'_>], number: u32) -> u64 {
    fields
        .iter()
        .rev()
        .find_map(|field| match (field.number == number, field.value) {
            (true, Value::Varint(value)) => Some(value),
            _ => None,
        })
        .unwrap_or(0)
}

/// The string of field `number` ("" when absent), which proto3 requires to
/// be valid UTF-8 (Go's decoder rejects a message otherwise).
pub fn string_of(what: &str, fields: &[Field<'_>], number: u32) -> String {
    match bytes_of(fields, number).last() {
        None => String::new(),
        Some(bytes) => std::str::from_utf8(bytes)
            .unwrap_or_else(|err| {
                panic!("expected {what} field {number} to be valid UTF-8: {err}: {bytes:?}")
            })
            .to_owned(),
    }
}

/// The values of a repeated varint field, packed or not.
pub fn packed_varints(fields: &[Field<'_>], number: u32) -> Result<Vec<u64>, String> {
    let mut values = Vec::new();
    for field in fields.iter().filter(|field| field.number == number) {
        match field.value {
            Value::Varint(value) => values.push(value),
            Value::Bytes(bytes) => {
                let mut at = 0;
                while at < bytes.len() {
                    values.push(varint(bytes, &mut at)?);
                }
            }
            other => {
                return Err(format!(
                    "field {number}: a varint or packed varints, got {other:?}"
                ));
            }
        }
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_fields_of_every_wire_type() {
        // 1: varint 300, 2: "hi", 3: fixed32 7, 4: fixed64 9, 5: packed [1, 150]
        let message = [
            0x08, 0xac, 0x02, 0x12, 2, b'h', b'i', 0x1d, 7, 0, 0, 0, 0x21, 9, 0, 0, 0, 0, 0, 0, 0, 0x2a, 3,
            1, 0x96, 0x01,
        ];
        let fields = fields(&message).unwrap();
        assert_eq!(varint_of(&fields, 1), 300);
        assert_eq!(string_of("m", &fields, 2), "hi");
        assert_eq!(fields[2].value, Value::Fixed32(7));
        assert_eq!(fields[3].value, Value::Fixed64(9));
        assert_eq!(packed_varints(&fields, 5).unwrap(), vec![1, 150]);
    }

    #[test]
    fn refuses_truncation_and_groups() {
        assert!(fields(&[0x12, 5, b'a']).is_err(), "a cut length-delimited field");
        assert!(fields(&[0x08, 0x80]).is_err(), "a cut varint");
        assert!(fields(&[0x0b]).is_err(), "a group start");
        assert!(fields(&[0x00, 1]).is_err(), "field number 0");
    }
}
