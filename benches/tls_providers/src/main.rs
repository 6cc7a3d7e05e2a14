//! AES-256-GCM open (TLS 1.3 records of 16 KiB) and X25519 key agreement: ring against
//! aws-lc-rs, rounds alternating which goes first, on the same inputs.
use std::time::Instant;

const RECORD: usize = 16 * 1024;
const TOTAL: usize = 512 << 20;

/// GB/s of AES-256-GCM `open_in_place` over `sealed` (records sealed with `key`, nonce =
/// record number), with `$lib` (`ring` or `aws_lc_rs`: the same `aead` API).
macro_rules! open_gbps {
    ($lib:ident, $key:expr, $sealed:expr) => {{
        use $lib::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
        let k = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, $key).unwrap());
        let t = Instant::now();
        let mut n = 0usize;
        while n < TOTAL {
            for (i, s) in $sealed.iter().enumerate() {
                let mut buf = s.clone();
                let out = k
                    .open_in_place(
                        Nonce::assume_unique_for_key(nonce(i as u64)),
                        Aad::empty(),
                        &mut buf,
                    )
                    .unwrap();
                n += out.len();
            }
        }
        n as f64 / t.elapsed().as_secs_f64() / 1e9
    }};
}

fn nonce(i: u64) -> [u8; 12] {
    let mut nonce = [0u8; 12];
    nonce[4..].copy_from_slice(&i.to_be_bytes());
    nonce
}

/// Microseconds per X25519 key pair plus agreement with a fixed peer, with `$lib`;
/// `$agree(private_key, peer_public_bytes)` agrees (the two libraries' `agree_ephemeral`
/// differ: aws-lc-rs takes the peer key by value and an error value).
macro_rules! x25519_us {
    ($lib:ident, $n:expr, $agree:expr) => {{
        use $lib::agreement::{EphemeralPrivateKey, X25519};
        let rng = $lib::rand::SystemRandom::new();
        let peer = EphemeralPrivateKey::generate(&X25519, &rng).unwrap();
        let peer_pub = peer.compute_public_key().unwrap();
        let t = Instant::now();
        for _ in 0..$n {
            let k = EphemeralPrivateKey::generate(&X25519, &rng).unwrap();
            let _ = k.compute_public_key().unwrap();
            $agree(k, peer_pub.as_ref());
        }
        t.elapsed().as_secs_f64() * 1e6 / $n as f64
    }};
}

fn ring_x25519(n: usize) -> f64 {
    use ring::agreement::{agree_ephemeral, UnparsedPublicKey, X25519};
    x25519_us!(ring, n, |k, peer: &[u8]| {
        agree_ephemeral(k, &UnparsedPublicKey::new(&X25519, peer), |s| s[0]).unwrap()
    })
}

fn awslc_x25519(n: usize) -> f64 {
    use aws_lc_rs::agreement::{agree_ephemeral, UnparsedPublicKey, X25519};
    x25519_us!(aws_lc_rs, n, |k, peer: &[u8]| {
        let peer = UnparsedPublicKey::new(&X25519, peer);
        agree_ephemeral(k, peer, aws_lc_rs::error::Unspecified, |s| Ok(s[0])).unwrap()
    })
}

fn main() {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
    let key = [7u8; 32];
    let k = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key).unwrap());
    // 64 records of pseudo-random bytes (xorshift), sealed once: both libraries open the
    // same bytes.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let sealed: Vec<Vec<u8>> = (0..64u64)
        .map(|i| {
            let mut b: Vec<u8> = (0..RECORD)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            k.seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce(i)),
                Aad::empty(),
                &mut b,
            )
            .unwrap();
            b
        })
        .collect();
    println!("round ring_GBps awslc_GBps ring_x25519_us awslc_x25519_us");
    for r in 0..6 {
        let (a, b) = if r % 2 == 0 {
            let a = open_gbps!(ring, &key, &sealed);
            (a, open_gbps!(aws_lc_rs, &key, &sealed))
        } else {
            let b = open_gbps!(aws_lc_rs, &key, &sealed);
            (open_gbps!(ring, &key, &sealed), b)
        };
        let (c, d) = (ring_x25519(2000), awslc_x25519(2000));
        println!("{r} {a:.2} {b:.2} {c:.1} {d:.1}");
    }
}
