//! The invariants a call is checked against when it returns, and its trace.

use super::*;

impl Call {
    /// Checks the invariants of any call; returns true on success.
    pub fn finish(&mut self, status: unikv_status) -> bool {
        let name = self.name;
        let code = status as u32;
        super::super::record(name, code);
        let msg = super::super::last_error();
        if super::super::tracing() {
            eprintln!("  {name} -> {status:?} {msg:?}");
        }
        assert!(code <= 17, "{name}: status {code} is not a unikv_status");
        assert_ne!(
            status,
            unikv_status::UNIKV_INTERNAL,
            "{name}: INTERNAL: {msg}"
        );
        for a in self.args.iter_mut() {
            a.after = self.mem.download(a.base, a.bytes);
        }
        if code != 0 && self.honest_must_pass && self.honest() {
            panic!("{name}: refused an honest call with {status:?}: {msg}");
        }
        if code != 0 {
            assert!(!msg.is_empty(), "{name}: status {code} without a message");
            for a in &self.args {
                if a.after != a.image {
                    panic!(
                        "{name}: failed with {status:?} ({msg}) but wrote {}",
                        a.name
                    );
                }
            }
            for w in &self.watched {
                let after = self.mem.download(w.base, w.image.len());
                assert!(
                    after == w.image,
                    "{name}: failed with {status:?} ({msg}) but wrote {}",
                    w.what
                );
            }
            return false;
        }
        if let Some(why) = &self.must_fail {
            if !(self.soft && self.grown) {
                panic!("{name}: accepted a call it must refuse: {why}");
            }
        }
        if self.aliased {
            return true;
        }
        for a in &self.args {
            match a.role {
                Role::In => assert!(
                    a.after == a.image,
                    "{name}: succeeded but wrote its input {}",
                    a.name
                ),
                Role::Out | Role::InOut => {
                    // The bytes after the call with the view's put back
                    // must be the bytes before it.
                    let mut outside = a.after.clone();
                    for (s, e) in view_ranges(&a.desc, a.base, a.bytes) {
                        outside[s..e].copy_from_slice(&a.image[s..e]);
                    }
                    if outside != a.image {
                        let i = (0..a.bytes).find(|&i| outside[i] != a.image[i]).unwrap();
                        panic!(
                            "{name}: wrote byte {i} of {}'s buffer outside its view {:?}",
                            a.name, a.desc
                        );
                    }
                }
            }
        }
        true
    }

    /// Prints the call (UNIKV_FUZZ_TRACE=1): its status, what made it
    /// hostile, and every tensor argument with small integer contents.
    pub fn trace(&self) {
        eprintln!("{}", self.name);
        if let Some(why) = &self.must_fail {
            eprintln!("    must fail: {why}");
        }
        if self.bad_contents || self.aliased {
            eprintln!(
                "    bad contents: {}, aliased: {}",
                self.bad_contents, self.aliased
            );
        }
        for (i, a) in self.args.iter().enumerate() {
            let d = &a.desc;
            let n = (d.ndim as usize).min(4);
            let honest_layout = d.data as usize >= a.base as usize
                && (d.data as usize) < a.base as usize + a.bytes
                && matches!(d.dtype, 4 | 5)
                && (1..=4).contains(&d.ndim)
                && d.shape[..n].iter().all(|&s| (0..=64).contains(&s))
                && d.strides[..n].iter().all(|&s| (0..=4096).contains(&s))
                && safe_or_refused(d, a.base, a.bytes);
            let values = if honest_layout && (d.data as usize - a.base as usize) % 4 == 0 {
                format!(" = {:?}", self.ints_before(i))
            } else {
                String::new()
            };
            eprintln!(
                "    {} {:?} dtype {} shape {:?} strides {:?} data {}{}",
                a.name,
                a.role,
                d.dtype,
                &d.shape[..n],
                &d.strides[..n],
                if d.data.is_null() {
                    "NULL".to_string()
                } else {
                    format!("+{}", d.data as isize - a.base as isize)
                },
                values
            );
        }
    }

    /// Elements of argument `i` after the call, read through its descriptor
    /// (which the call accepted) in logical order, as i64.
    pub fn ints_after(&self, i: usize) -> Vec<i64> {
        self.ints(i, true)
    }

    /// Elements of argument `i` as they were before the call.
    pub fn ints_before(&self, i: usize) -> Vec<i64> {
        self.ints(i, false)
    }

    fn ints(&self, i: usize, after: bool) -> Vec<i64> {
        let a = &self.args[i];
        let bytes = if after { &a.after } else { &a.image };
        let d = &a.desc;
        let elem = elem_size(d.dtype).unwrap_or(4);
        let n = d.ndim as usize;
        let mut out = Vec::new();
        if d.shape[..n].contains(&0) {
            return out;
        }
        let start = d.data as usize - a.base as usize;
        let mut idx = vec![0i64; n];
        loop {
            let off: i64 = idx.iter().zip(&d.strides[..n]).map(|(i, s)| i * s).sum();
            let at = start + off as usize * elem;
            let v = if elem == 8 {
                i64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap())
            } else {
                i32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap()) as i64
            };
            out.push(v);
            let mut axis = n;
            loop {
                if axis == 0 {
                    return out;
                }
                axis -= 1;
                idx[axis] += 1;
                if idx[axis] < d.shape[axis] {
                    break;
                }
                idx[axis] = 0;
            }
        }
    }
}
