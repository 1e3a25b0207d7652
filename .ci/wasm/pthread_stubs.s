# The pthread symbols current std references that Debian's wasi-libc (2022) lacks. No
# thread can be created on wasm32-wasip1: pthread_create fails with ENOTSUP (58), which
# std reports as ErrorKind::Unsupported (libtest then runs the tests one by one, rayon on
# the calling thread); join and detach are never reached and return EINVAL (28); the
# attribute calls succeed and do nothing. Assembled by .ci/wasm/env.sh.
	.text
	.globl	pthread_join
	.type	pthread_join,@function
pthread_join:
	.functype	pthread_join (i32, i32) -> (i32)
	i32.const	28
	end_function
	.globl	pthread_detach
	.type	pthread_detach,@function
pthread_detach:
	.functype	pthread_detach (i32) -> (i32)
	i32.const	28
	end_function
	.globl	pthread_create
	.type	pthread_create,@function
pthread_create:
	.functype	pthread_create (i32, i32, i32, i32) -> (i32)
	i32.const	58
	end_function
	.globl	pthread_attr_init
	.type	pthread_attr_init,@function
pthread_attr_init:
	.functype	pthread_attr_init (i32) -> (i32)
	i32.const	0
	end_function
	.globl	pthread_attr_destroy
	.type	pthread_attr_destroy,@function
pthread_attr_destroy:
	.functype	pthread_attr_destroy (i32) -> (i32)
	i32.const	0
	end_function
	.globl	pthread_attr_setstacksize
	.type	pthread_attr_setstacksize,@function
pthread_attr_setstacksize:
	.functype	pthread_attr_setstacksize (i32, i32) -> (i32)
	i32.const	0
	end_function
