use super::*;
use crate::pack::testing::jpeg;

/// A 1x1 PNG.
const PNG: [u8; 69] = [
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x02, 0x00, 0x00, 0x00, 0x90, 0x77, 0x53,
    0xde, 0x00, 0x00, 0x00, 0x0c, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8, 0xcf, 0xc0, 0x00,
    0x00, 0x03, 0x01, 0x01, 0x00, 0xc9, 0xfe, 0x92, 0xef, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4e,
    0x44, 0xae, 0x42, 0x60, 0x82,
];

#[test]
fn whole_images_pass_with_their_format() {
    let info = check_image(&jpeg(), "a.jpg").unwrap();
    assert_eq!(
        (info.format, info.width, info.height),
        (Format::Jpeg, 32, 24)
    );
    assert_eq!(extension(info.format), "jpg");
    let info = check_image(&PNG, "a.png").unwrap();
    assert_eq!(extension(info.format), "png");
    // Bytes after the end-of-image marker (camera padding) are fine.
    let mut padded = jpeg();
    padded.extend_from_slice(&[0; 100]);
    assert!(check_image(&padded, "p.jpg").is_ok());
}

#[test]
fn truncated_images_fail_saying_so() {
    let j = jpeg();
    for cut in [j.len() - 2, j.len() / 2, j.len() - 40] {
        let e = check_image(&j[..cut], "t.jpg").unwrap_err();
        assert!(e.contains("truncated") || e.contains("JPEG"), "{cut}: {e}");
    }
    let e = check_image(&PNG[..PNG.len() - 12], "t.png").unwrap_err();
    assert!(e.contains("truncated"), "{e}");
}

#[test]
fn non_images_fail_without_naming_the_file_twice() {
    let e = check_image(b"hello, this is text", "notes.jpg").unwrap_err();
    assert!(!e.starts_with("notes.jpg"), "{e}");
    assert!(check_image(b"", "empty.jpg").is_err());
}

#[test]
fn the_tail_checks_read_only_what_the_file_holds() {
    assert!(webp_whole(b"RIFF\xff\xff\xff\x7fWEBP").is_err());
    assert!(webp_whole(b"RIFF\x04\x00\x00\x00WEBP").is_ok());
    let mut bmp = vec![0u8; 64];
    bmp[..2].copy_from_slice(b"BM");
    bmp[2..6].copy_from_slice(&64u32.to_le_bytes());
    bmp[10..14].copy_from_slice(&54u32.to_le_bytes());
    assert!(bmp_whole(&bmp).is_ok());
    bmp[2..6].copy_from_slice(&65u32.to_le_bytes());
    assert!(bmp_whole(&bmp).is_err());
    assert!(png_whole(&PNG[..20]).is_err());
    // A chunk length that would overflow.
    let mut bad = PNG.to_vec();
    bad[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
    assert!(png_whole(&bad).is_err());
    assert!(first_scan(&[0xFF, 0xD8, 0xFF]).is_none());
}
