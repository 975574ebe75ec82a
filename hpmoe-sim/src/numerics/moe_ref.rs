//! The MoE-FFN reference: a per-token loop in f64 over each token's chosen experts, written
//! directly from the layer's definition (not from the op bodies, the tiles or the schedule).
//!
//! Forward: `out[t] = sum_j w_tj * (act(x[t] W_up[e_tj]) W_down[e_tj])` with
//! `act(h) = silu(h[..I]) * h[I..]` (SwiGLU: the gate is the first half of the up
//! projection); a user-defined activation is evaluated from its op body, row by row.
//! Backward (SwiGLU): with `dyd = w_tj dy[t]`, `da = W_down dyd`, `dh = swiglu'(h) da`:
//! `dx[t] = sum_j W_up dh`, `dW_down[e] = sum a^T dyd`, `dW_up[e] = sum xd^T dh`, where the
//! saved activations `xd` and `h` of each (token, choice) are read at its window row.

use super::eval::{eval, Env};
use super::store::TensorStore;
use hpmoe_dsl::ir::{Func, NodeId, Program, RouteKind, Taskflow, TensorId};
use hpmoe_dsl::lower::TaskGraph;

/// The reference outputs, by tensor.
pub type Outputs = Vec<(TensorId, TensorStore<f64>)>;

fn producer<'a>(p: &Program, tf: &'a Taskflow, t: TensorId, op: &str) -> Option<&'a hpmoe_dsl::ir::Node> {
    let n = tf.node(tf.tensor(t).producer?);
    plays(p, tf, &p.op(n.op).name, op).then_some(n)
}

/// Whether the op `name` plays the part of the stdlib's backward op `role` in `tf`: the op
/// itself, or, in a taskflow derived by `grad`, the vector-Jacobian product derived for that
/// part (`gmm_vjp_x` for `gmm_grad_x`, with a `_N` suffix when the name was taken: a derived
/// taskflow calls only derived ops and the forward's).
fn plays(p: &Program, tf: &Taskflow, name: &str, role: &str) -> bool {
    if name == role {
        return true;
    }
    let derived = match role {
        "gmm_grad_x" => "gmm_vjp_x",
        "gmm_grad_w" => "gmm_vjp_w",
        "swiglu_grad" => "swiglu_vjp_h",
        "combine_grad" => "combine_vjp_y",
        "dispatch_grad" => "dispatch_vjp_x",
        _ => return false,
    };
    p.grads.iter().any(|g| g.taskflow == tf.name)
        && (name == derived
            || name
                .strip_prefix(derived)
                .and_then(|s| s.strip_prefix('_'))
                .is_some_and(|k| k.parse::<u32>().is_ok()))
}

/// The activation and output-gradient inputs of a weight gradient: `gmm_grad_w(x, dy, r)`,
/// or the derived `gmm_vjp_w(dout, x)`.
fn weight_grad_inputs(p: &Program, n: &hpmoe_dsl::ir::Node) -> Option<(TensorId, TensorId)> {
    if p.op(n.op).name == "gmm_grad_w" {
        Some((*n.inputs.first()?, *n.inputs.get(1)?))
    } else {
        Some((*n.inputs.get(1)?, *n.inputs.first()?))
    }
}

fn is_input(tf: &Taskflow, t: TensorId) -> bool {
    tf.tensor(t).producer.is_none()
}

fn silu(x: f64) -> f64 {
    Func::Silu.eval(x, 0.0)
}

fn dsilu(x: f64) -> f64 {
    Func::Dsilu.eval(x, 0.0)
}

/// `v W` for `W` `[K, N]` stored row-major at `w`.
fn vec_mat(v: &[f64], w: &[f64], n: usize) -> Vec<f64> {
    let mut out = vec![0.0; n];
    for (k, &x) in v.iter().enumerate() {
        let row = &w[k * n..(k + 1) * n];
        for (o, &y) in out.iter_mut().zip(row) {
            *o += x * y;
        }
    }
    out
}

/// `W v` for `W` `[K, N]`: `out[k] = sum_n W[k][n] v[n]`.
fn mat_vec(w: &[f64], v: &[f64], k: usize) -> Vec<f64> {
    let n = v.len();
    (0..k)
        .map(|i| w[i * n..(i + 1) * n].iter().zip(v).map(|(a, b)| a * b).sum())
        .collect()
}

/// The activation of one row: SwiGLU, or the op's body evaluated on a one-row tensor.
fn activation(p: &Program, tf: &Taskflow, g: &TaskGraph, act: &hpmoe_dsl::ir::Node, h: &[f64]) -> Vec<f64> {
    if p.op(act.op).name == "swiglu" {
        let i = h.len() / 2;
        return (0..i).map(|n| silu(h[n]) * h[n + i]).collect();
    }
    let out_cols = tf.tensor(act.output).shape.last().and_then(|d| d.fixed()).unwrap_or(0) as usize;
    let input = act.inputs[0];
    let mut stores: Vec<TensorStore<f64>> = (0..tf.tensors.len())
        .map(|_| TensorStore {
            shape: vec![Vec::new()],
            data: vec![Vec::new()],
            writer: Vec::new(),
        })
        .collect();
    stores[input.0 as usize] = TensorStore {
        shape: vec![vec![1, h.len()]],
        data: vec![h.to_vec()],
        writer: Vec::new(),
    };
    let mut out = vec![0.0; out_cols];
    let mut env = Env {
        g,
        body: &act.body,
        inputs: &act.inputs,
        stores: &stores,
        routes: &[],
        rank: 0,
        vars: vec![0; act.body.vars.len()],
        ix: Vec::new(),
        out_of_range: false,
        log: None,
    };
    for st in &act.body.stmts {
        let hpmoe_dsl::ir::Target::Out(ix) = &st.target else {
            continue;
        };
        // The row variable is 0; the column variable runs over its range.
        let (
            Some(hpmoe_dsl::ir::Index::Affine { var: mv, .. }),
            Some(hpmoe_dsl::ir::Index::Affine { var: nv, coef, offset }),
        ) = (ix.first(), ix.get(1))
        else {
            continue;
        };
        let (lo, hi) = match act.body.vars[*nv].range {
            hpmoe_dsl::ir::VarRange::Fixed { lo, hi } => (lo, hi),
            _ => continue,
        };
        env.vars[*mv] = 0;
        for n in lo..hi {
            env.vars[*nv] = n;
            let v: f64 = eval(&mut env, &st.value);
            let col = coef * n + offset;
            if (0..out_cols as i64).contains(&col) {
                out[col as usize] = if st.accumulate { out[col as usize] + v } else { v };
            }
        }
    }
    out
}

fn weight_block(w: &TensorStore<f64>, rank: usize, el: usize) -> (&[f64], usize, usize) {
    let s = &w.shape[rank];
    let (k, n) = (s[1], s[2]);
    (&w.data[rank][el * k * n..(el + 1) * k * n], k, n)
}

/// The forward reference, when the taskflow is dispatch → gmm → activation → gmm → combine
/// (each comm op one call, or the rank-deduplicated pair of calls).
pub fn forward(p: &Program, tf: &Taskflow, g: &TaskGraph, inputs: &[TensorStore<f64>]) -> Option<Outputs> {
    let (_, out) = tf.outputs.first()?;
    let comb = producer(p, tf, *out, "combine")?;
    // Rank-deduplicated: `combine(combine(y, fanout(rr)), rr)` with `rr = by_rank(r)` (and the
    // dispatches likewise) computes the layer of `r`.
    let (comb_in, route) = match p.route(*comb.routes.first()?).kind {
        RouteKind::ByRank { of } => {
            let inner = producer(p, tf, comb.inputs[0], "combine")?;
            let fan = *inner.routes.first()?;
            (matches!(p.route(fan).kind, RouteKind::Fanout { of: v } if v == *comb.routes.first()?)).then_some(())?;
            (inner.inputs[0], of)
        }
        RouteKind::Fanout { .. } => return None,
        _ => (comb.inputs[0], *comb.routes.first()?),
    };
    let g2 = producer(p, tf, comb_in, "gmm")?;
    let act = tf.node(tf.tensor(g2.inputs[0]).producer?);
    if act.inputs.len() != 1 || act.engine != hpmoe_dsl::ir::Engine::Aiv {
        return None;
    }
    let g1 = producer(p, tf, act.inputs[0], "gmm")?;
    let mut disp = producer(p, tf, g1.inputs[0], "dispatch")?;
    if let RouteKind::Fanout { of } = p.route(*disp.routes.first()?).kind {
        disp = producer(p, tf, disp.inputs[0], "dispatch")?;
        (disp.routes.first() == Some(&of) && matches!(p.route(of).kind, RouteKind::ByRank { of: b } if b == route))
            .then_some(())?;
    } else if *disp.routes.first()? != route {
        return None;
    }
    let (x, w1, w2) = (disp.inputs[0], g1.inputs[1], g2.inputs[1]);
    if !(is_input(tf, x) && is_input(tf, w1) && is_input(tf, w2)) || tf.outputs.len() != 1 {
        return None;
    }
    let l = g.layouts.get(route.0 as usize)?.as_ref()?;
    let r = &l.routing;
    let (xs, w1s, w2s) = (&inputs[x.0 as usize], &inputs[w1.0 as usize], &inputs[w2.0 as usize]);
    let hidden = xs.shape[0][1];
    let mut out_store = TensorStore {
        shape: vec![vec![r.tokens, hidden]; r.ranks],
        data: vec![vec![0.0; r.tokens * hidden]; r.ranks],
        writer: Vec::new(),
    };
    for s in 0..r.ranks {
        for t in 0..r.tokens {
            let xrow = &xs.data[s][t * hidden..(t + 1) * hidden];
            for j in 0..r.topk {
                if !r.is_kept(s, t, j) {
                    // Dropped: the choice contributes nothing.
                    continue;
                }
                let e = r.expert_of(s, t, j);
                let (d, el) = (l.rank_of_expert(e), e % l.local_experts());
                let gate = r.weight[(s * r.tokens + t) * r.topk + j] as f64;
                let (wu, _, n1) = weight_block(w1s, d, el);
                let h = vec_mat(xrow, wu, n1);
                let a = activation(p, tf, g, act, &h);
                let (wd, _, n2) = weight_block(w2s, d, el);
                let y = vec_mat(&a, wd, n2);
                let o = &mut out_store.data[s][t * hidden..(t + 1) * hidden];
                for (oi, yi) in o.iter_mut().zip(&y) {
                    *oi += gate * yi;
                }
            }
        }
    }
    Some(vec![(*out, out_store)])
}

/// The backward reference (SwiGLU), when the taskflow has the reference runtime's DAG.
pub fn backward(p: &Program, tf: &Taskflow, g: &TaskGraph, inputs: &[TensorStore<f64>]) -> Option<Outputs> {
    let find = |op: &str| -> Vec<NodeId> {
        tf.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| plays(p, tf, &p.op(n.op).name, op))
            .map(|(i, _)| NodeId(i as u32))
            .collect()
    };
    let fanout = |n: &hpmoe_dsl::ir::Node| {
        n.routes.first().and_then(|r| match p.route(*r).kind {
            RouteKind::Fanout { of } => Some(of),
            _ => None,
        })
    };
    // The last dispatch_grad; in the rank-deduplicated form it follows one of the fanout.
    let dgrad = tf.node(*find("dispatch_grad").iter().find(|n| fanout(tf.node(**n)).is_none())?);
    let mut gx_in = dgrad.inputs[0];
    let mut views = None;
    if let RouteKind::ByRank { of } = p.route(*dgrad.routes.first()?).kind {
        let inner = producer(p, tf, gx_in, "dispatch_grad")?;
        (fanout(inner)? == *dgrad.routes.first()?).then_some(())?;
        gx_in = inner.inputs[0];
        views = Some((of, *dgrad.routes.first()?, *inner.routes.first()?));
    }
    let gx_up = producer(p, tf, gx_in, "gmm_grad_x")?;
    let sg = producer(p, tf, gx_up.inputs[0], "swiglu_grad")?;
    let gx_down = producer(p, tf, sg.inputs[0], "gmm_grad_x")?;
    let cg = producer(p, tf, gx_down.inputs[0], "combine_grad")?;
    let mut dy = cg.inputs[0];
    if let Some((_, rr, rl)) = views {
        (fanout(cg)? == rr && *cg.routes.first()? == rl).then_some(())?;
        let outer = producer(p, tf, dy, "combine_grad")?;
        (*outer.routes.first()? == rr).then_some(())?;
        dy = outer.inputs[0];
    } else if fanout(cg).is_some() {
        return None;
    }
    let (w_down, w_up, h) = (gx_down.inputs[1], gx_up.inputs[1], sg.inputs[1]);
    let gw: Vec<&hpmoe_dsl::ir::Node> = find("gmm_grad_w").into_iter().map(|i| tf.node(i)).collect();
    let gw_down = gw
        .iter()
        .find(|n| weight_grad_inputs(p, n).is_some_and(|(_, d)| d == cg.output))?;
    let gw_up = gw
        .iter()
        .find(|n| weight_grad_inputs(p, n).is_some_and(|(_, d)| d == sg.output))?;
    let xd = weight_grad_inputs(p, gw_up)?.0;
    let act = tf.node(tf.tensor(weight_grad_inputs(p, gw_down)?.0).producer?);
    if p.op(act.op).name != "swiglu" || act.inputs[0] != h {
        return None;
    }
    for t in [dy, w_down, w_up, h, xd] {
        if !is_input(tf, t) {
            return None;
        }
    }
    let route = views.map_or(*cg.routes.first()?, |v| v.0);
    let l = g.layouts.get(route.0 as usize)?.as_ref()?;
    let r = &l.routing;
    let (dys, wds, wus, hs, xds) = (
        &inputs[dy.0 as usize],
        &inputs[w_down.0 as usize],
        &inputs[w_up.0 as usize],
        &inputs[h.0 as usize],
        &inputs[xd.0 as usize],
    );
    let hidden = dys.shape[0][1];
    let h2 = hs.shape[0][1];
    let inter = h2 / 2;
    let mk = |shape: &Vec<Vec<usize>>| TensorStore {
        shape: shape.clone(),
        data: shape.iter().map(|s| vec![0.0; s.iter().product()]).collect(),
        writer: Vec::new(),
    };
    let mut dx = mk(&dys.shape);
    let mut dwu = mk(&wus.shape);
    let mut dwd = mk(&wds.shape);
    let mut slot = vec![0u32; r.ranks * r.tokens * r.topk];
    match views {
        None => {
            for s in 0..r.ranks {
                for e in &l.send[s] {
                    slot[(s * r.tokens + e.token as usize) * r.topk + e.choice as usize] = e.slot;
                }
            }
        }
        Some((_, rr, rl)) => {
            // A choice's row: its token's row on the expert's rank (by_rank), then that row's
            // row for the expert (fanout).
            let (lr, ll) = (
                g.layouts.get(rr.0 as usize)?.as_ref()?,
                g.layouts.get(rl.0 as usize)?.as_ref()?,
            );
            let mut by_rank = std::collections::HashMap::new();
            for s in 0..r.ranks {
                for e in &lr.send[s] {
                    let d = lr.routing.expert_of(s, e.token as usize, e.choice as usize);
                    by_rank.insert((s, e.token as usize, d), e.slot as usize);
                }
            }
            let mut local = std::collections::HashMap::new();
            for d in 0..r.ranks {
                for e in &ll.send[d] {
                    let x = ll.routing.expert_of(d, e.token as usize, e.choice as usize);
                    local.insert((d, e.token as usize, x), e.slot);
                }
            }
            for s in 0..r.ranks {
                for t in 0..r.tokens {
                    for j in (0..r.topk).filter(|&j| r.is_kept(s, t, j)) {
                        let e = r.expert_of(s, t, j);
                        let row = *by_rank.get(&(s, t, l.rank_of_expert(e)))?;
                        slot[(s * r.tokens + t) * r.topk + j] = *local.get(&(l.rank_of_expert(e), row, e))?;
                    }
                }
            }
        }
    }
    for s in 0..r.ranks {
        for t in 0..r.tokens {
            for j in 0..r.topk {
                if !r.is_kept(s, t, j) {
                    // Dropped: the choice contributes nothing.
                    continue;
                }
                let e = r.expert_of(s, t, j);
                let (d, el) = (l.rank_of_expert(e), e % l.local_experts());
                let gate = r.weight[(s * r.tokens + t) * r.topk + j] as f64;
                let row = slot[(s * r.tokens + t) * r.topk + j] as usize;
                let hrow = &hs.data[d][row * h2..(row + 1) * h2];
                let xrow = &xds.data[d][row * hidden..(row + 1) * hidden];
                let dyd: Vec<f64> = dys.data[s][t * hidden..(t + 1) * hidden]
                    .iter()
                    .map(|v| gate * v)
                    .collect();
                let (wd, kd, nd) = weight_block(wds, d, el);
                let da = mat_vec(wd, &dyd, kd);
                let a: Vec<f64> = (0..inter).map(|n| silu(hrow[n]) * hrow[n + inter]).collect();
                let base = el * kd * nd;
                for k in 0..kd {
                    for n in 0..nd {
                        dwd.data[d][base + k * nd + n] += a[k] * dyd[n];
                    }
                }
                let mut dh = vec![0.0; h2];
                for n in 0..inter {
                    dh[n] = da[n] * hrow[n + inter] * dsilu(hrow[n]);
                    dh[n + inter] = da[n] * silu(hrow[n]);
                }
                let (wu, ku, nu) = weight_block(wus, d, el);
                let dxd = mat_vec(wu, &dh, ku);
                let base = el * ku * nu;
                for k in 0..ku {
                    for n in 0..nu {
                        dwu.data[d][base + k * nu + n] += xrow[k] * dh[n];
                    }
                }
                for (o, v) in dx.data[s][t * hidden..(t + 1) * hidden].iter_mut().zip(&dxd) {
                    *o += v;
                }
            }
        }
    }
    let mut outs = Vec::new();
    for (name, tid) in &tf.outputs {
        let node = tf.node(tf.tensor(*tid).producer?);
        let store = if node.output == dgrad.output {
            dx.clone()
        } else if node.output == gw_up.output {
            dwu.clone()
        } else if node.output == gw_down.output {
            dwd.clone()
        } else {
            let _ = name;
            return None;
        };
        outs.push((*tid, store));
    }
    Some(outs)
}
