// AES-256-GCM open (TLS 1.3 records of 16 KiB) and X25519 agreement: ring against aws-lc-rs,
// interleaved rounds, the same inputs.
use std::time::Instant;

const RECORD: usize = 16 * 1024;
const TOTAL: usize = 512 << 20;

fn ring_open(key: &[u8; 32], sealed: &[Vec<u8>]) -> f64 {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
    let k = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).unwrap());
    let t = Instant::now();
    let mut n = 0usize;
    while n < TOTAL {
        for (i, s) in sealed.iter().enumerate() {
            let mut buf = s.clone();
            let mut nonce = [0u8; 12];
            nonce[4..].copy_from_slice(&(i as u64).to_be_bytes());
            let out = k
                .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut buf)
                .unwrap();
            n += out.len();
        }
    }
    n as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn awslc_open(key: &[u8; 32], sealed: &[Vec<u8>]) -> f64 {
    use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
    let k = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).unwrap());
    let t = Instant::now();
    let mut n = 0usize;
    while n < TOTAL {
        for (i, s) in sealed.iter().enumerate() {
            let mut buf = s.clone();
            let mut nonce = [0u8; 12];
            nonce[4..].copy_from_slice(&(i as u64).to_be_bytes());
            let out = k
                .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut buf)
                .unwrap();
            n += out.len();
        }
    }
    n as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn ring_x25519(n: usize) -> f64 {
    use ring::agreement::{agree_ephemeral, EphemeralPrivateKey, UnparsedPublicKey, X25519};
    let rng = ring::rand::SystemRandom::new();
    let peer = EphemeralPrivateKey::generate(&X25519, &rng).unwrap();
    let peer_pub = peer.compute_public_key().unwrap();
    let t = Instant::now();
    for _ in 0..n {
        let k = EphemeralPrivateKey::generate(&X25519, &rng).unwrap();
        let _ = k.compute_public_key().unwrap();
        agree_ephemeral(
            k,
            &UnparsedPublicKey::new(&X25519, peer_pub.as_ref()),
            |s| s[0],
        )
        .unwrap();
    }
    t.elapsed().as_secs_f64() * 1e6 / n as f64
}

fn awslc_x25519(n: usize) -> f64 {
    use aws_lc_rs::agreement::{agree_ephemeral, EphemeralPrivateKey, UnparsedPublicKey, X25519};
    let rng = aws_lc_rs::rand::SystemRandom::new();
    let peer = EphemeralPrivateKey::generate(&X25519, &rng).unwrap();
    let peer_pub = peer.compute_public_key().unwrap();
    let t = Instant::now();
    for _ in 0..n {
        let k = EphemeralPrivateKey::generate(&X25519, &rng).unwrap();
        let _ = k.compute_public_key().unwrap();
        agree_ephemeral(
            k,
            UnparsedPublicKey::new(&X25519, peer_pub.as_ref()),
            aws_lc_rs::error::Unspecified,
            |s| Ok(s[0]),
        )
        .unwrap();
    }
    t.elapsed().as_secs_f64() * 1e6 / n as f64
}

fn main() {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
    let key = [7u8; 32];
    let k = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key).unwrap());
    // 64 records of pseudo-random bytes, sealed once (both libraries read the same format).
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
            let mut nonce = [0u8; 12];
            nonce[4..].copy_from_slice(&i.to_be_bytes());
            k.seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut b)
                .unwrap();
            b
        })
        .collect();
    println!("round ring_GBps awslc_GBps ring_x25519_us awslc_x25519_us");
    for r in 0..6 {
        let (a, b) = if r % 2 == 0 {
            let a = ring_open(&key, &sealed);
            (a, awslc_open(&key, &sealed))
        } else {
            let b = awslc_open(&key, &sealed);
            (ring_open(&key, &sealed), b)
        };
        let (c, d) = (ring_x25519(2000), awslc_x25519(2000));
        println!("{r} {a:.2} {b:.2} {c:.1} {d:.1}");
    }
}
