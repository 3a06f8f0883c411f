//! Tests of the netlink encoding and decoding in `msg.rs`, malformed input included.

use std::net::IpAddr;

use super::family::Family;
use super::msg::*;

fn udp_entry(v6: bool) -> Entry {
    let (c, f, b): (IpAddr, IpAddr, IpAddr) = if v6 {
        (
            "2001:db8::10".parse().unwrap(),
            "fd00::a".parse().unwrap(),
            "fd00:1::5".parse().unwrap(),
        )
    } else {
        (
            "10.0.0.10".parse().unwrap(),
            "10.96.0.10".parse().unwrap(),
            "10.244.1.5".parse().unwrap(),
        )
    };
    Entry {
        orig: Tuple {
            src: c,
            dst: f,
            proto: IPPROTO_UDP,
            src_port: 40000,
            dst_port: 53,
        },
        reply: Tuple {
            src: b,
            dst: c,
            proto: IPPROTO_UDP,
            src_port: 5353,
            dst_port: 40000,
        },
        id: None,
        zone: 7,
    }
}

fn one_message(buf: &[u8]) -> Message<'_> {
    let all: Vec<_> = messages(buf).collect::<Result<_, _>>().unwrap();
    assert_eq!(all.len(), 1);
    all[0]
}

#[test]
fn create_message_round_trips_through_the_parser() {
    for v6 in [false, true] {
        let e = udp_entry(v6);
        let mut enc = Encoder::default();
        enc.create(9, &e, 120, STATUS_SEEN_REPLY);
        let m = one_message(&enc.buf);
        assert_eq!(m.ty, CT_NEW_TYPE);
        assert_eq!(m.seq, 9);
        assert_eq!(parse_entry(m.payload).unwrap(), e);
    }
}

#[test]
fn delete_always_carries_the_original_tuple_and_id() {
    let mut e = udp_entry(false);
    e.id = Some(0xdead_beef);
    let mut enc = Encoder::default();
    enc.delete(3, &e);
    let m = one_message(&enc.buf);
    assert_eq!(m.flags, NLM_F_REQUEST | NLM_F_ACK);
    let top: Vec<(u16, Vec<u8>)> = attrs(&m.payload[4..])
        .map(|a| a.map(|(t, v)| (t, v.to_vec())))
        .collect::<Result<_, _>>()
        .unwrap();
    let types: Vec<u16> = top.iter().map(|(t, _)| *t).collect();
    assert_eq!(types, vec![CTA_TUPLE_ORIG, CTA_ID, CTA_ZONE]);
    assert_eq!(parse_tuple(&top[0].1).unwrap(), e.orig);
    assert_eq!(top[1].1, 0xdead_beefu32.to_be_bytes());
}

#[test]
fn filtered_dump_names_only_the_protocol() {
    let mut enc = Encoder::default();
    enc.dump(1, Family::V6, Some(IPPROTO_UDP));
    let m = one_message(&enc.buf);
    assert_eq!(m.flags, NLM_F_REQUEST | NLM_F_DUMP);
    assert_eq!(m.payload[0], AF_INET6);
    let top: Vec<(u16, Vec<u8>)> = attrs(&m.payload[4..])
        .map(|a| a.map(|(t, v)| (t, v.to_vec())))
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(top.len(), 2);
    assert_eq!(top[0].0, CTA_FILTER);
    assert_eq!(top[1].0, CTA_TUPLE_ORIG);
    let inner: Vec<u16> = attrs(&top[1].1).map(|a| a.unwrap().0).collect();
    assert_eq!(
        inner,
        vec![CTA_TUPLE_PROTO],
        "no CTA_TUPLE_IP in the filter"
    );

    enc.clear();
    enc.dump(2, Family::V4, None);
    let m = one_message(&enc.buf);
    assert_eq!(m.payload.len(), 4, "unfiltered dump has no attributes");
}

#[test]
fn several_messages_in_one_buffer_are_all_read() {
    let mut enc = Encoder::default();
    for seq in 0..5 {
        enc.create(seq, &udp_entry(seq % 2 == 0), 60, 0);
    }
    let seqs: Vec<u32> = messages(&enc.buf).map(|m| m.unwrap().seq).collect();
    assert_eq!(seqs, vec![0, 1, 2, 3, 4]);
}

#[test]
fn missing_and_malformed_fields_are_errors() {
    // No reply tuple.
    let mut enc = Encoder::default();
    enc.delete(1, &udp_entry(false));
    let m = one_message(&enc.buf);
    assert_eq!(
        parse_entry(m.payload),
        Err(ParseError::Missing("CTA_TUPLE_REPLY"))
    );
    assert!(matches!(
        parse_entry(&[2, 0]),
        Err(ParseError::Truncated { .. })
    ));
    // An attribute claiming more bytes than there are.
    let bad = [2, 0, 0, 0, 40, 0, 1, 0x80, 0, 0];
    assert!(matches!(
        parse_entry(&bad),
        Err(ParseError::Truncated { .. })
    ));
    // nlmsg_len below the header size.
    let mut hdr = vec![0u8; 16];
    hdr[0] = 8;
    assert!(matches!(
        messages(&hdr).next(),
        Some(Err(ParseError::BadLength { .. }))
    ));
    assert_eq!(error_code(&(-2i32).to_ne_bytes()), Ok(2));
    assert!(error_code(&[1, 2]).is_err());
}

/// Every input must give Ok or Err, never a panic; iterating must end.
fn parse_everything(buf: &[u8]) {
    for m in messages(buf).take(10_000) {
        match m {
            Ok(m) => {
                let _ = parse_entry(m.payload);
                let _ = error_code(m.payload);
            }
            Err(_) => break,
        }
    }
    let _ = parse_entry(buf);
}

struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn parser_never_panics_on_truncations_mutations_and_noise() {
    let mut valid = Encoder::default();
    let mut e6 = udp_entry(true);
    e6.id = Some(42);
    valid.create(1, &udp_entry(false), 30, 0);
    valid.create(2, &e6, 30, 0);
    let mut tcp = udp_entry(false);
    tcp.orig.proto = IPPROTO_TCP;
    tcp.reply.proto = IPPROTO_TCP;
    valid.create(3, &tcp, 30, 0);
    let v = valid.buf.clone();

    for cut in 0..=v.len() {
        parse_everything(&v[..cut]);
        parse_everything(&v[cut..]);
    }
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    for pos in 0..v.len() {
        for val in [0u8, 1, 3, 4, 0x7f, 0x80, 0xff, rng.next() as u8] {
            let mut m = v.clone();
            m[pos] = val;
            parse_everything(&m);
        }
    }
    for _ in 0..20_000 {
        let mut m = v.clone();
        for _ in 0..(rng.next() % 6 + 1) {
            let pos = (rng.next() as usize) % m.len();
            m[pos] = rng.next() as u8;
        }
        let cut = (rng.next() as usize) % (m.len() + 1);
        parse_everything(&m[..cut]);
    }
    for _ in 0..20_000 {
        let len = (rng.next() % 300) as usize;
        let noise: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        parse_everything(&noise);
    }
}
