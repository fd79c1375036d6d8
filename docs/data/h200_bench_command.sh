cat > /tmp/b.py <<'X'
import time,json,os,sys,jax,jax.numpy as jnp,numpy as np,flax.linen as nn
from rljax import model as M,sampler as S
P=dict(decode_bound=dict(d_model=512,num_layers=8,num_heads=8,num_kv_heads=2,head_dim=64,num_experts=8,expert_hidden=1024,dense_hidden=2048),full=dict(d_model=1024,num_layers=16,num_heads=16,num_kv_heads=4,head_dim=128,num_experts=32,experts_per_token=4,expert_hidden=768,dense_hidden=3072,dtype='bfloat16',remat='full'))
def t(f):
 jax.block_until_ready(f());s=[]
 for _ in range(3):a=time.perf_counter();jax.block_until_ready(f());s.append(time.perf_counter()-a)
 return float(np.median(s))
n,N=sys.argv[1],64
c=M.ModelConfig(moe_impl='ragged',**P[n]);m=M.Transformer(c)
p=nn.unbox(M.init_params(c,jax.random.PRNGKey(0)))
smp=S.make_sampler(m,S.SamplingConfig(max_new_tokens=N,eos_id=-1,pad_id=0))
def L(p,x):
 g,_,a=m.apply({'params':p},x,jnp.ones(x.shape,bool))
 return a-jnp.take_along_axis(jax.nn.log_softmax(g[:,:-1]),x[:,1:,None],-1).mean()
g=jax.jit(jax.grad(L));R=[]
for b in map(int,sys.argv[2].split(',')):
 x=jnp.ones((b,8),jnp.int32)
 r=t(lambda:smp(p,x,x>0,jax.random.PRNGKey(1)).tokens_BxL)
 u=t(lambda:g(p,jnp.ones((b,8+N),jnp.int32)))
 R.append([b,r,u]);print(n,b,r,u,flush=True)
 json.dump(dict(params=sum(v.size for v in jax.tree.leaves(p)),device=str(jax.devices()[0]),new_tokens=N,rows=R),open(os.environ['OUT']+f'/{n}.json','w'))
X
export PYTHONPATH=.
timeout 200 python3 /tmp/b.py decode_bound 1,2,4,8,16,32,64,128,256,512 2>&1|grep -v Warn|tail -12
timeout 280 python3 /tmp/b.py full 1,4,16,64,256 2>&1|grep -v Warn|tail -8
