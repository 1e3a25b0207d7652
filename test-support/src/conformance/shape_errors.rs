//! Every shape error of every kernel: a call with inconsistent shapes returns the
//! specific [`ShapeError`] and writes nothing (outputs filled with a sentinel stay
//! bit for bit as they were).

use kvcore::backend::{AttnParams, Backend, Rope, RopeStyle, ShapeError, Weights};
use kvcore::kv::KvView;
use kvcore::ndarray::{Array3, Axis, Slice};

/// Every shape error of every kernel on `b`: the specific [`ShapeError`], the output
/// left untouched.
///
/// # Panics
/// If a check fails.
pub fn check<B: Backend>(b: &B) {
    const SENTINEL: f32 = -1234.5;
    let f = |n: usize| vec![SENTINEL; n];
    let untouched = |v: &[f32]| assert!(v.iter().all(|&x| x.to_bits() == SENTINEL.to_bits()));
    let len = |what, expected, actual| ShapeError::Length {
        what,
        expected,
        actual,
    };
    let not_multiple = |what, len, multiple| ShapeError::NotMultiple {
        what,
        len,
        multiple,
    };
    let wdata = vec![0.5f32; 4 * 8];
    let w = Weights::from_f32(4, 8, &wdata).unwrap();

    // gemv: x [cols], y [rows]
    let mut y = f(4);
    assert_eq!(b.gemv(&w, &f(7), &mut y), Err(len("gemv x", 8, 7)));
    untouched(&y);
    let mut y = f(3);
    assert_eq!(b.gemv(&w, &f(8), &mut y), Err(len("gemv y", 4, 3)));
    untouched(&y);

    // gemm: x [n, cols], y [n, rows], cols > 0
    let mut y = f(8);
    assert_eq!(
        b.gemm(&w, &f(12), &mut y),
        Err(not_multiple("gemm x", 12, 8))
    );
    untouched(&y);
    let mut y = f(7);
    assert_eq!(b.gemm(&w, &f(16), &mut y), Err(len("gemm y", 8, 7)));
    untouched(&y);
    let empty = Weights::from_f32(4, 0, &[]).unwrap();
    let mut y = f(0);
    assert_eq!(
        b.gemm(&empty, &f(0), &mut y),
        Err(ShapeError::Geometry("gemm with zero columns"))
    );

    // rope: head_dim even and non-zero, x [positions, k·head_dim]
    let rope = Rope {
        base: 10_000.0,
        style: RopeStyle::Halves,
    };
    let odd = ShapeError::Geometry("rope head_dim must be even and non-zero");
    for hd in [0, 3] {
        let mut x = f(12);
        assert_eq!(b.rope(&mut x, hd, &[0, 1], &rope), Err(odd.clone()));
        untouched(&x);
    }
    let mut x = f(10);
    assert_eq!(
        b.rope(&mut x, 4, &[0, 1], &rope),
        Err(not_multiple("rope x", 10, 8))
    );
    untouched(&x);
    let mut x = f(9);
    assert_eq!(
        b.rope(&mut x, 2, &[0, 1, 2], &rope),
        Err(not_multiple("rope x", 9, 6))
    );
    assert_eq!(b.rope(&mut x, 2, &[], &rope), Err(len("rope x", 0, 9)));
    untouched(&x);

    // attention: q, out [n, n_heads, hd]; q_pos [n]; the view's heads dividing n_heads,
    // its head_dim equal; heads and head_dim non-zero; last axes contiguous.
    let a3 = |n, h, d| Array3::from_elem((n, h, d), SENTINEL);
    let untouched3 = |a: &Array3<f32>| untouched(a.as_slice().expect("standard layout"));
    let (keys, values) = (a3(3, 2, 2), a3(3, 2, 2));
    let kv = KvView::from_f32(keys.view(), values.view()).unwrap();
    let params = AttnParams::causal(2);
    let (q, mut out) = (a3(2, 4, 2), a3(2, 4, 2));
    let dims = |what, expected, actual| {
        Err(ShapeError::Dims {
            what,
            expected,
            actual,
        })
    };
    let mut small = a3(2, 3, 2);
    assert_eq!(
        b.attention(q.view(), &[1, 2], &kv, &params, small.view_mut()),
        dims("attention out", [2, 4, 2], [2, 3, 2])
    );
    untouched3(&small);
    assert_eq!(
        b.attention(q.view(), &[1], &kv, &params, out.view_mut()),
        Err(len("attention q_pos", 2, 1))
    );
    let geometry = |what| Err(ShapeError::Geometry(what));
    let zero = "attention heads and head_dim must be non-zero";
    let (q0, mut out0) = (a3(2, 0, 2), a3(2, 0, 2));
    assert_eq!(
        b.attention(q0.view(), &[1, 2], &kv, &params, out0.view_mut()),
        geometry(zero)
    );
    let (qd, mut outd) = (a3(2, 4, 0), a3(2, 4, 0));
    let (kd, vd) = (a3(3, 2, 0), a3(3, 2, 0));
    let kvd = KvView::from_f32(kd.view(), vd.view()).unwrap();
    assert_eq!(
        b.attention(qd.view(), &[1, 2], &kvd, &params, outd.view_mut()),
        geometry(zero)
    );
    let (q3, mut out3) = (a3(2, 3, 2), a3(2, 3, 2));
    assert_eq!(
        b.attention(q3.view(), &[1, 2], &kv, &params, out3.view_mut()),
        geometry("n_heads must be a multiple of n_kv_heads")
    );
    untouched3(&out3);
    let (q4, mut out4) = (a3(2, 4, 4), a3(2, 4, 4));
    assert_eq!(
        b.attention(q4.view(), &[1, 2], &kv, &params, out4.view_mut()),
        Err(len("attention kv head_dim", 4, 2))
    );
    untouched3(&out4);
    // Every other element of a [.., 4] axis: shape [.., 2], stride 2.
    let wide = a3(2, 4, 4);
    let strided = wide.slice_axis(Axis(2), Slice::new(0, None, 2));
    assert_eq!(
        b.attention(strided, &[1, 2], &kv, &params, out.view_mut()),
        Err(ShapeError::NotContiguous {
            what: "attention q"
        })
    );
    let mut wide_out = a3(2, 4, 4);
    assert_eq!(
        b.attention(
            q.view(),
            &[1, 2],
            &kv,
            &params,
            wide_out.slice_axis_mut(Axis(2), Slice::new(0, None, 2))
        ),
        Err(ShapeError::NotContiguous {
            what: "attention out"
        })
    );
    untouched3(&wide_out);
    let wide_keys = a3(3, 2, 4);
    let strided_kv = KvView::from_f32(
        wide_keys.slice_axis(Axis(2), Slice::new(0, None, 2)),
        values.view(),
    )
    .unwrap();
    assert_eq!(
        b.attention(q.view(), &[1, 2], &strided_kv, &params, out.view_mut()),
        Err(ShapeError::NotContiguous {
            what: "attention keys"
        })
    );
    untouched3(&out);

    // rms_norm: x, out [n, d], weight [d] non-empty
    let mut out = f(6);
    assert_eq!(
        b.rms_norm(&f(6), &[], 1e-5, &mut out),
        Err(ShapeError::Geometry("rms_norm weight is empty"))
    );
    assert_eq!(
        b.rms_norm(&f(6), &f(4), 1e-5, &mut out),
        Err(not_multiple("rms_norm x", 6, 4))
    );
    assert_eq!(
        b.rms_norm(&f(8), &f(4), 1e-5, &mut out),
        Err(len("rms_norm out", 8, 6))
    );
    untouched(&out);

    // swiglu, geglu, add: equal lengths (the `what` label is the backend's own)
    let length_mismatch = |r: Result<(), ShapeError>, expected, actual| match r {
        Err(ShapeError::Length {
            expected: e,
            actual: a,
            ..
        }) => assert_eq!((e, a), (expected, actual)),
        other => panic!("expected a length error, got {other:?}"),
    };
    type Gated<'a> = &'a dyn Fn(&[f32], &[f32], &mut [f32]) -> Result<(), ShapeError>;
    let gated: [Gated<'_>; 2] = [&|g, u, o| b.swiglu(g, u, o), &|g, u, o| b.geglu(g, u, o)];
    for op in gated {
        // A short `up`, then a short `out`.
        for (up, out) in [(4, 5), (5, 4)] {
            let mut out = f(out);
            length_mismatch(op(&f(5), &f(up), &mut out), 5, 4);
            untouched(&out);
        }
    }
    let mut acc = f(5);
    length_mismatch(b.add(&mut acc, &f(6)), 5, 6);
    untouched(&acc);

    // embed_row: row < rows, out [cols]
    let mut out = f(8);
    let index = ShapeError::Index {
        what: "embedding rows",
        index: 4,
        len: 4,
    };
    assert_eq!(b.embed_row(&w, 4, &mut out), Err(index));
    untouched(&out);
    let mut out = f(7);
    assert_eq!(
        b.embed_row(&w, 0, &mut out),
        Err(len("embedding out", 8, 7))
    );
    untouched(&out);
}
