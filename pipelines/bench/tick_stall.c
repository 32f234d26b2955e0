// tick_stall: does a rank's work after a call delay its peer's receive on the shaped cluster?
// Two ranks exchange two 40 KiB messages each way per iteration (isend/irecv/waitall); then
// rank 0 does MODE for 40 ms (`spin`: a busy loop, `mem`: touching 64 MiB, `sleep`, `none`)
// while rank 1, already done, reports how long its two exchanges took. With both ranks bound
// to one core (each shaped host's Open MPI daemon binds its first rank to core 0), `spin`
// and `mem` cost rank 1 up to a scheduler tick (4 ms here); docs/SIMULATE.md, "Calibration".
//
//   mpicc -O2 -o /tmp/tick_stall pipelines/bench/tick_stall.c
//   pipelines/cluster.sh up --hosts 2 --rate 1gbit
//   pipelines/cluster.sh run -np 2 -- /tmp/tick_stall spin        # as cluster.sh runs now
//   pipelines/cluster.sh run -np 2 -- --bind-to core /tmp/tick_stall spin   # as it did
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  MPI_Init(&argc,&argv); int r; MPI_Comm_rank(MPI_COMM_WORLD,&r);
  if(argc!=2){ if(r==0) fprintf(stderr,"usage: tick_stall spin|mem|sleep|none\n"); MPI_Finalize(); return 2; }
  const char*mode=argv[1]; int n=10485, iters=12;
  float*a=calloc(n,4),*b=calloc(n,4),*c=calloc(n,4),*d=calloc(n,4);
  size_t big=64<<20; char*mem=malloc(big); memset(mem,1,big);
  double tot=0; int peer=1-r;
  for(int it=0;it<iters;it++){
    MPI_Barrier(MPI_COMM_WORLD);
    if(r==1) usleep(100); // r1 arrives a little later: r0 finishes first, then computes
    MPI_Request q[2];
    double t0=now();
    MPI_Irecv(c,n,MPI_FLOAT,peer,1,MPI_COMM_WORLD,&q[0]); MPI_Isend(a,n,MPI_FLOAT,peer,1,MPI_COMM_WORLD,&q[1]); MPI_Waitall(2,q,MPI_STATUSES_IGNORE);
    MPI_Irecv(d,n,MPI_FLOAT,peer,2,MPI_COMM_WORLD,&q[0]); MPI_Isend(b,n,MPI_FLOAT,peer,2,MPI_COMM_WORLD,&q[1]); MPI_Waitall(2,q,MPI_STATUSES_IGNORE);
    double dt=now()-t0;
    if(r==0){ double e=now()+0.04;
      if(!strcmp(mode,"spin")) while(now()<e);
      else if(!strcmp(mode,"mem")) { while(now()<e) for(size_t i=0;i<big;i+=64) mem[i]++; }
      else if(!strcmp(mode,"sleep")) usleep(40000);
    }
    if(it>=2 && r==1) tot+=dt;
    if(r==1 && it>=2) printf("%.2f ", dt*1e3);
  }
  if(r==1) printf(" | %s: r1 mean %.2f ms\n",mode,tot/(iters-2)*1e3);
  MPI_Finalize(); return 0;
}
