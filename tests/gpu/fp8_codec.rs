//! The device FP8 codec against src/fp8.rs, through a test hook.

use super::*;

/// Every tested value encodes, scales and decodes on the GPU bit for bit as in
/// src/fp8.rs: the software codec, and for e4m3fn the hardware conversion
/// (sm_89+, pairs, so the byte order is checked too).
#[cfg(feature = "test-hooks")]
#[test]
fn fp8_codec_matches_rust_on_gpu() {
    use unikv::fp8::{decode, encode, ue8m0_scale_byte, Fp8Format};
    let Some(s) = setup() else { return };
    let mut rng = rand::rng();
    let mut values: Vec<f32> = (0..=u16::MAX)
        .map(|b| f32::from_bits(u32::from(b) << 16))
        .collect();
    for fmt in [Fp8Format::E4m3Fn, Fp8Format::E4m3Fnuz] {
        // Every code, the midpoints between neighbours, and one ULP either side.
        let codes: Vec<f32> = (0..=0x7Fu8)
            .map(|c| decode(c, fmt))
            .filter(|v| v.is_finite())
            .collect();
        for pair in codes.windows(2) {
            let mid = (pair[0] + pair[1]) / 2.0;
            for v in [
                pair[0],
                mid,
                f32::from_bits(mid.to_bits() - 1),
                f32::from_bits(mid.to_bits() + 1),
            ] {
                values.extend([v, -v]);
            }
        }
    }
    values.extend([
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        0.0,
        -0.0,
        1e30,
        -1e30,
    ]);
    values.extend((0..1 << 20).map(|_| f32::from_bits(rng.random())));
    let n = values.len();
    let x = Dev::upload(&s.gpu, &values);
    for (format, fmt) in [(0u32, Fp8Format::E4m3Fn), (1, Fp8Format::E4m3Fnuz)] {
        let out: Vec<Dev> = (0..3).map(|_| Dev::zeroed(&s.gpu, n)).collect();
        let decoded = Dev::zeroed(&s.gpu, 256 * 4);
        for d in out.iter().chain([&decoded]) {
            d.poison();
        }
        unsafe {
            unikv::ffi::test_hooks::gpu_fp8_check(
                x.ptr.cast(),
                n,
                format,
                [out[0].ptr.cast(), out[1].ptr.cast(), out[2].ptr.cast()],
                decoded.ptr.cast(),
            )
        }
        .unwrap();
        let (sw, hw, scale) = (
            out[0].read::<u8>(),
            out[1].read::<u8>(),
            out[2].read::<u8>(),
        );
        for (i, &v) in values.iter().enumerate() {
            let want = encode(v, fmt);
            assert_eq!(
                sw[i],
                want,
                "{fmt:?} software encode of {v:e} ({:#x})",
                v.to_bits()
            );
            assert_eq!(
                hw[i],
                want,
                "{fmt:?} hardware encode of {v:e} ({:#x})",
                v.to_bits()
            );
            let scale_want = ue8m0_scale_byte(v.abs(), fmt);
            assert_eq!(scale[i], scale_want, "{fmt:?} scale byte of {v:e}");
        }
        let got: Vec<f32> = decoded.read();
        for code in 0..=255u8 {
            assert_eq!(
                got[code as usize].to_bits(),
                decode(code, fmt).to_bits(),
                "{fmt:?} decode of {code:#04x}"
            );
        }
    }
}
